// Request rules and secrets (E2B's network.rules and Secret) through the
// official E2B SDK, in the fake internet of tests/netlab: the lab's web
// servers answer /headers with the headers they received and write every
// request down (AIRLOCK_LAB_HTTP_LOG), so the test sees both what the
// sandbox was answered and what left the host. The daemon verifies the
// lab's TLS servers with the lab's CA (SSL_CERT_FILE), as it would the
// internet's with the host's roots.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import { Sandbox, Secret, ALL_TRAFFIC } from 'e2b'
import { join } from 'node:path'
import { execFileSync } from 'node:child_process'
import { startServer } from './harness.mjs'
import { airlockCgroups, read } from './reliability-util.mjs'

const labDNS = process.env.AIRLOCK_LAB_DNS
const skip = !labDNS && 'the egress suite needs the fake internet: run it under tests/netlab (make test does)'

// What left the host since mark, for host.
const labLog = () => readFileSync(process.env.AIRLOCK_LAB_HTTP_LOG, 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l))
const since = (mark, host) => labLog().slice(mark).filter((r) => r.host.split(':')[0] === host)

// The three clients the issue names, each sending a forged Authorization
// of its own; each prints the body it was answered.
const clients = {
  curl: (url) => `curl -sS --max-time 10 -H 'Authorization: Bearer forged' ${url}`,
  requests: (url) => `python3 -c "import requests; print(requests.get('${url}', headers={'Authorization': 'Bearer forged'}, timeout=10).text)"`,
  fetch: (url) => `node -e "fetch('${url}', {headers: {Authorization: 'Bearer forged'}}).then((r) => r.text()).then(console.log, (e) => { console.error(String(e.cause ?? e)); process.exit(1) })"`,
}

// Searches for a secret given as two halves, which are never side by
// side in the searcher's memory: scan.py A B searches, inside a sandbox,
// every process's environment and readable memory and every file outside
// /proc, /sys, /dev and the host's /usr; scan.py A B PID… searches, from
// the host, the memory of those processes (every process of every
// sandbox: the agent's, the kernel's, gVisor's sentry with its guest's
// memory). Memory is read 16 MiB at a time: a sandbox has little to spare.
const scanScript = String.raw`
import os, re, sys
a, b = sys.argv[1].encode(), sys.argv[2].encode()
found, procs, regions, files, size = [], 0, 0, 0, 0
def search(read, where, limit):
    global size
    tail, at = b"", 0
    while at < limit:
        try:
            chunk = tail + read(at, min(16 << 20, limit - at))
        except (OSError, ValueError, OverflowError):
            return
        if len(chunk) == len(tail):
            return
        i = chunk.find(a)
        while i >= 0:
            if chunk[i + len(a):i + len(a) + len(b)] == b:
                found.append(where)
                return
            i = chunk.find(a, i + 1)
        at += len(chunk) - len(tail)
        size += len(chunk) - len(tail)
        tail = chunk[-(len(a) + len(b)):]
def memory(pid):
    global procs, regions
    if pid == str(os.getpid()):
        return  # its own memory holds the halves, and chunks of itself
    try:
        maps = open("/proc/%s/maps" % pid).read().splitlines()
        mem = open("/proc/%s/mem" % pid, "rb", 0)
    except OSError:
        return
    try:
        pagemap = open("/proc/%s/pagemap" % pid, "rb", 0)
    except OSError:
        pagemap = None  # gVisor has none: its own reads fill nothing
    procs += 1
    for line in maps:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
        if not m or "[vvar" in line or "[vsyscall" in line:
            continue
        lo, hi = int(m.group(1), 16), int(m.group(2), 16)
        # Only the pages the process has (pagemap's present bit): reading
        # a hole of a shared mapping (gVisor's guest memory) would fill
        # it, charged to the sandbox, whose memory it would exhaust.
        try:
            if pagemap:
                pagemap.seek(lo // 4096 * 8)
                entries = pagemap.read((hi - lo) // 4096 * 8)
            else:
                entries = b"\x80" * ((hi - lo) // 4096 * 8)
        except OSError:
            continue
        runs, start = [], None
        for k in range(len(entries) // 8):
            present = entries[k * 8 + 7] & 0x80
            if present and start is None:
                start = k
            elif not present and start is not None:
                runs.append((start, k))
                start = None
        if start is not None:
            runs.append((start, len(entries) // 8))
        for first, end in runs:
            base = lo + first * 4096
            def read(at, n):
                mem.seek(base + at)
                return mem.read(n)
            search(read, "memory of %s (%s)" % (pid, line.split()[-1]), (end - first) * 4096)
        regions += 1
pids = sys.argv[3:]
if pids:
    for pid in pids:
        memory(pid)
else:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = open("/proc/%s/environ" % pid, "rb").read()
            search(lambda at, n: env[at:at + n], "environment of %s" % pid, len(env))
        except OSError:
            pass
        memory(pid)
    for root, dirs, names in os.walk("/"):
        if root == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev", "usr")]
        for n in names:
            path = os.path.join(root, n)
            try:
                with open(path, "rb") as f:
                    if not os.path.isfile(path):
                        continue
                    def read(at, n):
                        f.seek(at)
                        return f.read(n)
                    search(read, path, os.fstat(f.fileno()).st_size)
                files += 1
            except OSError:
                pass
print("found %s in %d processes, %d regions, %d files, %d MiB" % (found, procs, regions, files, size >> 20))
`

// The processes of every sandbox on the host.
function sandboxPids() {
  const pids = new Set()
  for (const cg of airlockCgroups()) {
    for (const pid of (read(join(cg, 'cgroup.procs')) ?? '').split('\n')) if (pid) pids.add(pid)
  }
  return [...pids]
}

// Which CA issued the certificate the sandbox is shown for host:443.
const issuerScript = String.raw`
import socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # the lab CA alone
ctx.load_verify_locations("/home/user/lab-ca.pem")
with ctx.wrap_socket(socket.create_connection((sys.argv[1], 443), timeout=10), server_hostname=sys.argv[1]) as s:
    print(dict(x[0] for x in s.getpeercert()["issuer"])["commonName"])
`

let server
before(async () => {
  if (skip) return
  server = await startServer([], {
    config: { network: { dns: [labDNS] }, templates: { base: { poolSize: 1 }, 'code-interpreter-v1': { poolSize: 0 } } },
    env: { SSL_CERT_FILE: process.env.AIRLOCK_LAB_CA },
  })
})
after(async () => {
  if (skip) return
  const { code } = await server.stop()
  assert.equal(code, 0)
})

test('secrets: values go in and never come back out', { skip }, async () => {
  const value = 'sv-' + randomBytes(16).toString('hex')
  const name = 'Team-Key-' + randomBytes(3).toString('hex')
  const info = await Secret.create(name, value, { metadata: { owner: 'tests' } })
  assert.equal(info.name, name.toLowerCase())
  assert.match(info.secretId, /^sec_/)
  assert.equal(info.version, 1)
  assert.deepEqual(info.metadata, { owner: 'tests' })
  await assert.rejects(Secret.create(name, 'again'), /409|exists/)
  const updated = await Secret.update(info.secretId, value + '-2')
  assert.equal(updated.version, 2)
  assert.deepEqual(updated.metadata, { owner: 'tests' }, 'metadata kept when the update names none')
  assert.equal((await Secret.getInfo(name.toLowerCase())).secretId, info.secretId)
  // Nothing the API answers holds the value.
  for (const path of ['/secrets', `/secrets/${info.secretId}`, `/secrets/${name.toLowerCase()}`]) {
    const body = await (await fetch(server.env.E2B_API_URL + path, { headers: { 'X-API-Key': server.apiKey } })).text()
    assert.ok(body.includes(info.secretId), `${path}: ${body}`)
    assert.ok(!body.includes(value), `${path} answers the value`)
  }
  // Pages of a list, with the next page's token.
  const more = []
  for (let i = 0; i < 3; i++) more.push((await Secret.create(`page-${i}-${randomBytes(3).toString('hex')}`, 'v')).secretId)
  const seen = []
  const pages = Secret.list({ limit: 2 })
  while (pages.hasNext) seen.push(...(await pages.nextItems()).map((s) => s.secretId))
  for (const id of [info.secretId, ...more]) assert.ok(seen.includes(id), `${id} listed`)
  assert.equal(new Set(seen).size, seen.length, 'no secret listed twice')
  assert.equal(await Secret.destroy(info.secretId), true)
  assert.equal(await Secret.exists(info.secretId), false)
  assert.equal(await Secret.destroy(info.secretId), false)
  for (const id of more) await Secret.destroy(id)
})

test('request rules: the secret reaches the server, never the sandbox', { skip, timeout: 240_000 }, async () => {
  const value = 'lab-' + randomBytes(20).toString('hex')
  const secret = await Secret.create('lab-key-' + randomBytes(3).toString('hex'), value)
  const rules = { 'allowed.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(secret.name)}`, 'X-Team': 'blue' } } }] }
  await assert.rejects(Sandbox.create({ network: { allowOut: ['allowed.test'], rules: { 'allowed.test': [{ transform: { headers: { A: Secret.fill('no-such-secret') } } }] } } }),
    /no secret named "no-such-secret"/)
  // code-interpreter-v1: base and Python's requests.
  const sbx = await Sandbox.create('code-interpreter-v1', { timeoutMs: 180_000, network: { allowOut: ['allowed.test', 'other.test'], denyOut: [ALL_TRAFFIC], rules } })
  try {
    await sbx.files.write('/home/user/lab-ca.pem', readFileSync(process.env.AIRLOCK_LAB_CA, 'utf8'))
    await sbx.files.write('/home/user/scan.py', scanScript)
    await sbx.files.write('/home/user/issuer.py', issuerScript)
    assert.deepEqual((await sbx.getInfo()).network?.rules, rules, 'getInfo answers the rules as given')
    const run = async (cmd, opts = {}) => {
      try {
        return (await sbx.commands.run(cmd, { timeoutMs: 30_000, ...opts })).stdout.trim()
      } catch (e) {
        throw new Error(`${cmd}: ${e.message}: ${e.stderr ?? ''}${e.stdout ?? ''}`)
      }
    }
    const masked = 'Bearer ' + '*'.repeat(value.length)

    // Each client, over HTTPS: the server got the secret in place of the
    // forged header; the sandbox saw it masked.
    const answers = []
    for (const [client, cmd] of Object.entries(clients)) {
      for (const url of ['https://allowed.test/headers']) {
        const mark = labLog().length
        const out = await run(cmd(url))
        answers.push(out)
        const headers = JSON.parse(out)
        assert.deepEqual(headers.Authorization, [masked], `${client} ${url}: the answer repeats the secret masked`)
        assert.deepEqual(headers['X-Team'], ['blue'], `${client} ${url}`)
        const sent = since(mark, 'allowed.test')
        assert.equal(sent.length, 1, `${client} ${url}: one request reached the server`)
        assert.equal(sent[0].authorization, `Bearer ${value}`, `${client} ${url}: the server got the secret`)
        assert.equal(sent[0].tls, url.startsWith('https'), `${client} ${url}: over TLS to the server as from the sandbox`)
      }
    }
    for (const out of answers) assert.ok(!out.includes(value))
    // Plain HTTP never carries a secret: refused, nothing sent.
    let mark = labLog().length
    assert.equal(await run(`curl -sS -o /dev/null -w '%{http_code}' http://allowed.test/headers`), '403')
    assert.equal(since(mark, 'allowed.test').length, 0, 'nothing reached the server over plain HTTP')
    assert.match(await run('python3 /home/user/issuer.py allowed.test').catch((e) => e.message), /CERTIFICATE_VERIFY_FAILED/,
      "a host with rules is shown the egress CA's certificate, which the lab's CA does not verify")
    assert.match(await run(`python3 -c "import ssl, socket; s = ssl.create_default_context().wrap_socket(socket.create_connection(('allowed.test', 443)), server_hostname='allowed.test'); print(dict(x[0] for x in s.getpeercert()['issuer'])['commonName'])"`),
      /^Airlock egress CA /, "the system's store trusts the egress CA")

    // A host without rules is not intercepted: the server's own
    // certificate, and the sandbox's own header, as it sent it.
    assert.equal(await run('python3 /home/user/issuer.py other.test'), 'Airlock test lab CA')
    mark = labLog().length
    await run(`curl -sS --cacert /home/user/lab-ca.pem -H 'Authorization: Bearer forged' https://other.test/headers`)
    assert.equal(since(mark, 'other.test')[0]?.authorization, 'Bearer forged')

    // Nowhere in the sandbox: environment, memory, files, as its root
    // sees them; and every sandbox process's memory, as the host sees it.
    // Each search first finds what is there (a marker in a file and in a
    // process's memory), so that finding nothing means something.
    await sbx.files.write('/home/user/marker.txt', 'marker-' + '1234'.repeat(4))
    const holder = await sbx.commands.run(`python3 -c "import time; m = 'mark' + 'er-' + '1234' * 4; time.sleep(600)"`, { background: true })
    const half = value.length / 2
    const scanIn = (a, b) => run(`python3 /home/user/scan.py ${a} ${b}`, { user: 'root', timeoutMs: 120_000 })
    const scanHost = (a, b) => execFileSync('python3', ['-c', scanScript, a, b, ...sandboxPids()], { maxBuffer: 1 << 20 }).toString().trim()
    assert.match(await scanIn('marker-', '1234'.repeat(4)), /marker\.txt/, 'the search in the sandbox finds a file')
    assert.match(scanHost('marker-', '1234'.repeat(4)), /found \['memory of \d+/, "the search from the host finds a process's memory")
    const inside = await scanIn(value.slice(0, half), value.slice(half))
    assert.match(inside, /^found \[\] in \d+ processes, \d+ regions, [1-9]\d* files, \d+ MiB$/, inside)
    const outside = scanHost(value.slice(0, half), value.slice(half))
    console.log(`# in the sandbox: ${inside}; from the host: ${outside}`)
    assert.match(outside, /^found \[\] in [1-9]\d* processes, [1-9]\d* regions, 0 files, [1-9]\d* MiB$/, outside)
    await holder.kill()

    // The secret's new version is sent from the next request on; the rules
    // change at run time, and without rules nothing is intercepted.
    await Secret.update(secret.secretId, value + 'v2')
    const red = { 'allowed.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(secret.name)}`, 'X-Team': 'red' } } }] }
    await sbx.updateNetwork({ allowOut: ['allowed.test', 'other.test'], denyOut: [ALL_TRAFFIC], rules: red })
    mark = labLog().length
    assert.deepEqual(JSON.parse(await run(clients.curl('https://allowed.test/headers')))['X-Team'], ['red'])
    assert.equal(since(mark, 'allowed.test')[0].authorization, `Bearer ${value}v2`)
    await sbx.updateNetwork({ allowOut: ['allowed.test'], denyOut: [ALL_TRAFFIC] })
    assert.equal((await sbx.getInfo()).network?.rules, undefined, 'updateNetwork without rules clears them')
    mark = labLog().length
    await run(`curl -sS --cacert /home/user/lab-ca.pem -H 'Authorization: Bearer forged' https://allowed.test/headers`)
    assert.equal(since(mark, 'allowed.test')[0]?.authorization, 'Bearer forged', 'no rules: passed through as sent')

    // A secret that is gone fails closed: the request is refused.
    await sbx.updateNetwork({ allowOut: ['allowed.test'], denyOut: [ALL_TRAFFIC], rules: red })
    await Secret.destroy(secret.secretId)
    mark = labLog().length
    const refused = await run(`curl -sS -o /dev/null -w '%{http_code}' https://allowed.test/headers`)
    assert.equal(refused, '403')
    assert.equal(since(mark, 'allowed.test').length, 0, 'nothing reached the server')
  } finally {
    await sbx.kill()
    await Secret.destroy(secret.secretId).catch(() => {})
  }
})

// The audit trail, read through the API.
async function trail(srv, id, format = '') {
  const res = await fetch(`${srv.env.E2B_API_URL}/sandboxes/${id}/audit${format}`, { headers: { 'X-API-Key': srv.apiKey } })
  assert.equal(res.status, 200, `audit of ${id}: ${res.status}`)
  return format === '?format=jsonl' ? await res.text() : await res.json()
}

test('learning mode: the allowlist of exactly the hosts a run reached', { skip, timeout: 120_000 }, async () => {
  // Observed, not enforced: the internet, every decision written down.
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  try {
    await sbx.files.write('/home/user/lab-ca.pem', readFileSync(process.env.AIRLOCK_LAB_CA, 'utf8'))
    await sbx.commands.run('curl -sS --cacert /home/user/lab-ca.pem https://allowed.test/ && curl -sS http://other.test/ && ' +
      `python3 -c "import socket; print(socket.create_connection(('198.51.100.7', 7000), timeout=5).recv(100))"`, { timeoutMs: 30_000 })
    const res = await fetch(`${server.env.E2B_API_URL}/sandboxes/${sbx.sandboxId}/audit/allowlist`, { headers: { 'X-API-Key': server.apiKey } })
    const proposal = await res.json()
    assert.deepEqual(proposal, { allowOut: ['198.51.100.7', 'allowed.test', 'other.test'], denied: [] })
    // Pasted into allowOut, it lets the same run through, and nothing else.
    const strict = await Sandbox.create({ timeoutMs: 120_000, network: { allowOut: proposal.allowOut, denyOut: [ALL_TRAFFIC] } })
    try {
      await strict.files.write('/home/user/lab-ca.pem', readFileSync(process.env.AIRLOCK_LAB_CA, 'utf8'))
      await strict.commands.run('curl -sS --cacert /home/user/lab-ca.pem https://allowed.test/ && curl -sS http://other.test/ && ' +
        `python3 -c "import socket; print(socket.create_connection(('198.51.100.7', 7000), timeout=5).recv(100))"`, { timeoutMs: 30_000 })
      await assert.rejects(strict.commands.run('curl -sS --max-time 5 http://denied.test/', { timeoutMs: 30_000 }))
    } finally {
      await strict.kill()
    }
  } finally {
    await sbx.kill()
  }
})

test('the audit trail: every decision, its rule, the bytes, the API actions', { skip, timeout: 120_000 }, async () => {
  const sbx = await Sandbox.create({ timeoutMs: 120_000, network: { allowOut: ['allowed.test', '198.51.100.7'], denyOut: [ALL_TRAFFIC] } })
  const id = sbx.sandboxId
  try {
    await sbx.setTimeout(100_000)
    const banner = 'banner from 198.51.100.7\n'
    const probe = String.raw`
import socket
s = socket.create_connection(("198.51.100.7", 7000), timeout=5)
print(len(s.recv(100)))
for addr in ("203.0.113.20", "10.99.0.5"):
    try:
        socket.create_connection((addr, 443), timeout=5).recv(1)
    except OSError as e:
        print(addr, "refused")
try:
    socket.gethostbyname("denied.test")
except OSError:
    print("denied.test not resolved")
`
    await sbx.files.write('/home/user/probe.py', probe)
    const out = (await sbx.commands.run('python3 /home/user/probe.py', { timeoutMs: 30_000 })).stdout
    assert.match(out, new RegExp(`^${banner.length}\n`))
    await sbx.updateNetwork({ allowOut: ['allowed.test'], denyOut: [ALL_TRAFFIC] })
    const { events } = await trail(server, id)
    const find = (f, what) => { const e = events.find(f); assert.ok(e, `${what} in ${JSON.stringify(events, null, 1)}`); return e }
    const conn = find((e) => e.kind === 'connection' && e.addr === '198.51.100.7', 'the banner connection')
    assert.equal(conn.decision, 'allowed')
    assert.equal(conn.port, 7000)
    assert.equal(conn.received, banner.length, 'the bytes the server sent')
    assert.equal(conn.sent ?? 0, 0)
    for (const addr of ['203.0.113.20', '10.99.0.5']) {
      const e = find((e) => e.kind === 'connection' && e.addr === addr, `the refused ${addr}`)
      assert.equal(e.decision, 'denied')
      assert.ok(e.rule, `${addr} names its rule`)
    }
    const dns = find((e) => e.kind === 'dns' && e.name === 'denied.test', 'the refused lookup')
    assert.equal(dns.decision, 'denied')
    assert.match(dns.rule, /^NXDOMAIN: .*polic/)
    const actions = events.filter((e) => e.kind === 'api').map((e) => [e.action, e.status])
    assert.deepEqual(actions.map(([a, st]) => [a.replace(/^POST \/(v2\/)?sandboxes$/, 'create'), st]),
      [['create', 201], ['POST /sandboxes/{id}/timeout', 204], ['PUT /sandboxes/{id}/network', 204]])
    for (const e of events.filter((e) => e.kind === 'api')) assert.match(e.actor, /^key sha256:[0-9a-f]{8} from 127\.0\.0\.1$/)
    // The same trail as JSON lines and as OpenTelemetry logs.
    assert.equal((await trail(server, id, '?format=jsonl')).trim().split('\n').length, events.length)
    const otlp = await trail(server, id, '?format=otlp')
    assert.equal(otlp.resourceLogs[0].scopeLogs[0].logRecords.length, events.length)
    assert.ok(otlp.resourceLogs[0].resource.attributes.some((a) => a.key === 'airlock.sandbox.id' && a.value.stringValue === id))
  } finally {
    await sbx.kill()
  }
  // Kept after the sandbox ends, the kill written down.
  const { events } = await trail(server, id)
  assert.deepEqual(events.at(-1).action, 'DELETE /sandboxes/{id}')
})

test('a budget ends a transfer at its limit', { skip, timeout: 120_000 }, async () => {
  const budget = 1 << 20
  const srv = await startServer([], {
    config: { network: { dns: [labDNS], budget: '1M' }, templates: { base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 } } },
  })
  const opts = { apiUrl: srv.env.E2B_API_URL, apiKey: srv.apiKey }
  try {
    const sbx = await Sandbox.create({ ...opts, timeoutMs: 120_000 })
    const got = await sbx.commands.run('curl -sS -o /home/user/big http://allowed.test/bytes?n=5000000; stat -c %s /home/user/big', { timeoutMs: 60_000 }).catch((e) => e)
    const size = Number(got.stdout.trim().split('\n').at(-1))
    assert.ok(size > 0 && size <= budget, `downloaded ${size} bytes under a budget of ${budget}`)
    const after = await sbx.commands.run('curl -sS --max-time 5 http://allowed.test/', { timeoutMs: 30_000 }).catch((e) => e)
    assert.notEqual(after.exitCode, 0, 'egress stays closed past the budget')
    const { events } = await trail(srv, sbx.sandboxId)
    const spent = events.find((e) => e.kind === 'budget')
    assert.ok(spent, 'the trail says the budget was spent')
    assert.match(spent.rule, /budget of 1048576 bytes/)
    assert.match(events.at(-1).rule ?? '', /budget is spent/, 'a connection after it is refused for it')
    await sbx.kill()
  } finally {
    await srv.stop()
    Object.assign(process.env, server.env) // the SDK's default server again
  }
})

test("egressProxy: the sandbox's TCP goes through the user's SOCKS5 proxy, and nowhere else", { skip, timeout: 120_000 }, async () => {
  // The lab's SOCKS5 proxy on other.test's address; the lab's servers
  // see a connection through it come from the lab, not from the host.
  const proxy = { address: '203.0.113.30:1080', username: 'lab', password: 'lab-pass' }
  const fetchFrom = async (sbx) => {
    const mark = labLog().length
    const r = await sbx.commands.run('curl -sS --max-time 10 http://allowed.test/headers', { timeoutMs: 30_000 }).catch((e) => e)
    return { code: r.exitCode, sent: since(mark, 'allowed.test') }
  }
  await assert.rejects(Sandbox.create({ network: { egressProxy: { address: '10.99.0.5:1080' } } }), /private or reserved/)
  const sbx = await Sandbox.create({ timeoutMs: 120_000, network: { egressProxy: proxy } })
  try {
    const info = await sbx.getInfo()
    assert.deepEqual(info.network?.egressProxy, { address: proxy.address, username: 'lab' }, 'getInfo never answers the password')
    let { code, sent } = await fetchFrom(sbx)
    assert.equal(code, 0)
    assert.equal(sent.length, 1)
    assert.notEqual(sent[0].from, '203.0.113.2', 'the request came through the proxy, not from the host')
    // Wrong credentials: the proxy refuses, and nothing goes out directly.
    await sbx.updateNetwork({ egressProxy: { ...proxy, password: 'wrong' } })
    ;({ code, sent } = await fetchFrom(sbx))
    assert.notEqual(code, 0)
    assert.equal(sent.length, 0, 'a refusing proxy fails closed')
    // Without one: straight from the host again.
    await sbx.updateNetwork({})
    ;({ code, sent } = await fetchFrom(sbx))
    assert.equal(code, 0)
    assert.equal(sent[0]?.from, '203.0.113.2')
  } finally {
    await sbx.kill()
  }
})
