// Sandbox networks through the official E2B SDK, against a fake internet
// of the test's own: tests/netlab runs this suite in a network namespace
// whose only uplink leads to the lab's DNS, HTTP, TLS and TCP servers
// (internal/nettest), so no packet can leave the machine. Its addresses:
//   allowed.test 203.0.113.10, denied.test 203.0.113.20, other.test
//   203.0.113.30 (HTTP 80, TLS 443, a banner on 7000 everywhere),
//   rebind.test → 10.99.0.5 (private), 198.51.100.7 (allowed by address
//   only), 169.254.169.254 (metadata), DNS 203.0.113.53; the host (where
//   the daemon and this test run) is 203.0.113.2.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { request } from 'node:http'
import { randomBytes } from 'node:crypto'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox, ALL_TRAFFIC } from 'e2b'
import { startServer, sleep } from './harness.mjs'

const labDNS = process.env.AIRLOCK_LAB_DNS
const skip = !labDNS && 'the network suite needs the fake internet: run it under tests/netlab (make test does)'

// Run in the sandbox: one probe per call, one line out, "OK …" or "FAIL …".
const probeScript = String.raw`
import socket, ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile="/home/user/lab-ca.pem")
def probe(kind, *a):
    if kind == "http":
        return urllib.request.urlopen(a[0], timeout=5, context=ctx).read().decode().strip()
    if kind == "resolve":
        return socket.gethostbyname(a[0])
    if kind == "tcp":
        s = socket.create_connection((a[0], int(a[1])), timeout=5)
        s.settimeout(5)
        data = s.recv(200)
        if not data:
            raise ConnectionError("closed without a byte")
        return data.decode().strip()
    if kind == "sni":  # TLS to address a[0] presenting name a[1]
        s = socket.create_connection((a[0], 443), timeout=5)
        tls = ssl.create_default_context(cafile="/home/user/lab-ca.pem")
        if a[1] == "-":  # no server name at all
            tls.check_hostname = False
        c = tls.wrap_socket(s, server_hostname=None if a[1] == "-" else a[1])
        c.sendall(b"GET / HTTP/1.0\r\nHost: " + a[1].encode() + b"\r\n\r\n")
        return c.recv(200).decode().split("\r\n")[0]
    if kind == "keepalive":  # two requests on one connection to a[0], for Host a[1] then a[2]
        s = socket.create_connection((a[0], 80), timeout=5)
        f = s.makefile("rb")
        codes = []
        for host in a[1:3]:
            s.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
            status = f.readline().split()
            codes.append(status[1].decode() if len(status) > 1 else "none")
            length = 0
            while True:
                line = f.readline()
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                if line in (b"\r\n", b""):
                    break
            f.read(length)
        return " ".join(codes)
    if kind == "dns":  # a query of type a[2] for a[3] over a[1] (udp, tcp) to a[0] ("-": the sandbox's resolver)
        server = a[0]
        if server == "-":
            server = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
        qtype = {"A": 1, "AAAA": 28, "TXT": 16, "MX": 15, "SRV": 33, "SOA": 6, "PTR": 12}[a[2]]
        q = b"\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
        q += b"".join(bytes([len(p)]) + p.encode() for p in a[3].split(".")) + b"\x00" + qtype.to_bytes(2, "big") + b"\x00\x01"
        if a[1] == "udp":
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(3)
            s.sendto(q, (server, 53))
            r = s.recv(512)
        else:
            s = socket.create_connection((server, 53), timeout=3)
            s.sendall(len(q).to_bytes(2, "big") + q)
            r = s.recv(514)[2:]
        return "rcode %d answers %d" % (r[3] & 15, int.from_bytes(r[6:8], "big"))
    if kind == "tunnel":  # names a[0]-N.a[1] for N < a[2], of many types, over UDP and TCP, to the sandbox's resolver and to a[3:]
        import random, select, time
        mine = next((l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")), "169.254.0.53")
        servers = [mine] + list(a[3:])
        types = [1, 28, 16, 15, 33, 5, 2, 6, 12, 257, 65, 255]  # A AAAA TXT MX SRV CNAME NS SOA PTR CAA HTTPS ANY
        def query(name, qtype):
            q = random.randbytes(2) + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
            return q + b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00" + qtype.to_bytes(2, "big") + b"\x00\x01"
        names = ["%s-%d" % (a[0], i) + ("" if a[1] == "-" else "." + a[1]) for i in range(int(a[2]))]
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sent = answered = 0
        for i, name in enumerate(names):
            for server in servers:
                for qtype in types:
                    try:
                        udp.sendto(query(name, qtype), (server, 53)); sent += 1
                    except OSError:  # no route: a sandbox without a network
                        pass
                # and over TCP, one type a name, a connection each
                try:
                    s = socket.create_connection((server, 53), timeout=1)
                    q = query(name, types[i % len(types)])
                    s.sendall(len(q).to_bytes(2, "big") + q); sent += 1
                    if s.recv(2): answered += 1
                    s.close()
                except OSError:
                    pass
            time.sleep(0.15)  # under the rate limits: refusals are the policy's
        end = time.time() + 2
        while time.time() < end and select.select([udp], [], [], max(0, end - time.time()))[0]:
            udp.recv(512); answered += 1
        return "sent %d answered %d" % (sent, answered)
    if kind == "flood":  # a[0] DNS queries to the sandbox's resolver and a[0] connections to 203.0.113.30:7000, all at once
        import select, time
        n = int(a[0])
        mine = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for i in range(n):
            udp.sendto(i.to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05flood\x04test\x00\x00\x01\x00\x01", (mine, 53))
        answered = 0
        while select.select([udp], [], [], 2)[0]:  # two seconds without an answer: the rest were dropped
            udp.recv(512); answered += 1
        conns = []
        for i in range(n):
            c = socket.socket(); c.setblocking(False)
            c.connect_ex(("203.0.113.30", 7000)); conns.append(c)
        # Connected (a byte from the banner, or refused after the
        # handshake) or not after two quiet seconds: dropped SYNs are not.
        reached, end = 0, time.time() + 2
        pending = list(conns)
        while pending and time.time() < end:
            _, ready, _ = select.select([], pending, [], max(0, end - time.time()))
            for c in ready:
                pending.remove(c)
                if c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) in (0, 104):  # connected, or reset by the proxy
                    reached += 1
            if ready:
                end = time.time() + 2
        return "dns %d tcp %d" % (answered, reached)
    if kind == "myip":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("203.0.113.1", 9))
        return s.getsockname()[0]
try:
    print("OK", probe(*sys.argv[1:]))
except Exception as e:
    print("FAIL", type(e).__name__, e)
`

let server
before(async () => {
  if (skip) return
  server = await startServer([], { config: { network: { dns: [labDNS], localZones: ['corp.test'] }, templates: { base: { poolSize: 1 }, 'code-interpreter-v1': { poolSize: 0 } } } })
})
after(async () => {
  if (skip) return
  const { code } = await server.stop()
  assert.equal(code, 0)
  assert.deepEqual(await settled(sandboxLinks), [], 'no veth of a sandbox outlives the daemon')
  // The last server on the host deletes the table, elements and all.
  assert.doesNotMatch(execFileSync('nft', ['list', 'tables']).toString(), /inet airlock_v1/, "the host's nftables table outlived the daemon")
})

// The host ends of sandboxes' veth pairs, and their elements in the
// host's nftables maps and their chains of limits.
const sandboxLinks = () => execFileSync('ip', ['-o', 'link', 'show']).toString().split('\n')
  .map((l) => l.split(': ')[1]?.split('@')[0]).filter((n) => n?.startsWith('al-'))
const sandboxElements = () => [['map', 'proxy'], ['map', 'dns_udp'], ['map', 'dns_tcp'], ['set', 'tcp_in'], ['set', 'udp_in'], ['map', 'flood']]
  .flatMap(([kind, m]) => execFileSync('nft', ['list', kind, 'inet', 'airlock_v1', m]).toString().match(/"al-[0-9a-f]+"/g) ?? [])
  .concat(execFileSync('nft', ['list', 'table', 'inet', 'airlock_v1']).toString().match(/chain flood-al-[0-9a-f]+/g) ?? [])
// The kernel deletes an ended sandbox's namespace, and its veth pair, in
// the background: f's answer once it stops changing, within 10 s.
async function settled(f, want = []) {
  let got = f()
  for (let i = 0; i < 200 && got.length !== want.length; i++) { await sleep(50); got = f() }
  return got
}

async function create(opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: 120_000, ...opts })
  await sbx.files.write('/home/user/probe.py', probeScript)
  await sbx.files.write('/home/user/lab-ca.pem', readFileSync(process.env.AIRLOCK_LAB_CA, 'utf8'))
  return sbx
}

async function probe(sbx, ...args) {
  const r = await sbx.commands.run(`python3 /home/user/probe.py ${args.join(' ')}`, { timeoutMs: 30_000 })
  return r.stdout.trim()
}

async function expectOK(sbx, match, ...args) {
  const out = await probe(sbx, ...args)
  assert.match(out, /^OK /, `${args.join(' ')}: ${out}`)
  if (match) assert.match(out, match, `${args.join(' ')}: ${out}`)
}

async function expectFail(sbx, ...args) {
  const out = await probe(sbx, ...args)
  assert.match(out, /^FAIL /, `${args.join(' ')} should fail: ${out}`)
}

// A listener on the host that must never hear from a sandbox.
async function hostListener(addr) {
  let accepted = 0
  const srv = createServer((c) => { accepted++; c.destroy() })
  await new Promise((ok) => srv.listen(0, addr, ok))
  return { port: srv.address().port, accepted: () => accepted, close: () => srv.close() }
}

// The control plane's API on this test's server, with its key.
const api = (method, path, body) => fetch(process.env.E2B_API_URL + path, {
  method, headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
  body: body && JSON.stringify(body),
})

// E2B's rule: a sandbox that says nothing has the internet (never the
// host, private ranges or metadata), and it is a pool claim as one
// without a network was: pools keep sandboxes in closed networks.
test('by default a sandbox has the internet, from the pool', { skip }, async () => {
  for (let i = 0; i < 200; i++) {
    const { pools } = await (await api('GET', '/airlock/pools')).json()
    if (pools.find((p) => p.template === 'base')?.ready > 0) break
    await sleep(50)
  }
  const sbx = await create()
  try {
    assert.equal((await sbx.getInfo()).allowInternetAccess, true)
    await expectOK(sbx, /hello from 203\.0\.113\.10 for allowed\.test/, 'http', 'https://allowed.test/')
    await expectOK(sbx, /banner from 198\.51\.100\.7/, 'tcp', '198.51.100.7', '7000')
    await expectFail(sbx, 'tcp', '203.0.113.2', '22')
    await expectFail(sbx, 'tcp', '10.99.0.5', '80')
    await expectFail(sbx, 'tcp', '169.254.169.254', '80')
    const line = server.log().split('\n').find((l) => l.includes('sandbox created') && l.includes(sbx.sandboxId))
    assert.match(line, /warm=true/, 'the default sandbox was started cold, not claimed from the pool')
    // Its network, made for the pool, logs under the sandbox's id now.
    assert.ok(server.log().split('\n').some((l) => l.includes('connection refused') && l.includes(sbx.sandboxId)),
      'the refusals of a claimed sandbox are not logged under its id')
  } finally {
    await sbx.kill()
  }
})

test('a sealed sandbox (allowInternetAccess: false) reaches nothing, and says so', { skip }, async () => {
  const sbx = await create({ allowInternetAccess: false })
  try {
    await expectFail(sbx, 'tcp', '203.0.113.10', '80')
    await expectFail(sbx, 'tcp', '198.51.100.7', '7000')
    await expectFail(sbx, 'resolve', 'allowed.test')
    await expectFail(sbx, 'tcp', '203.0.113.2', '22')
    assert.equal((await sbx.getInfo()).allowInternetAccess, false)
  } finally {
    await sbx.kill()
  }
})

// ALL_TRAFFIC as E2B defines it: denied, nothing but allowOut; allowed,
// every destination (allowOut wins), which here is the internet, never
// the host, private ranges or metadata.
test('ALL_TRAFFIC in denyOut and in allowOut', { skip }, async () => {
  const none = await create({ network: { denyOut: [ALL_TRAFFIC] } })
  const all = await create({ network: { denyOut: [ALL_TRAFFIC], allowOut: [ALL_TRAFFIC] } })
  try {
    await expectFail(none, 'tcp', '198.51.100.7', '7000')
    await expectFail(none, 'resolve', 'allowed.test')
    await expectOK(all, /banner from 198\.51\.100\.7/, 'tcp', '198.51.100.7', '7000')
    await expectOK(all, /for allowed\.test/, 'http', 'https://allowed.test/')
    await expectFail(all, 'tcp', '203.0.113.2', '22')
    await expectFail(all, 'tcp', '10.99.0.5', '80')
    await expectFail(all, 'tcp', '169.254.169.254', '80')
    await expectFail(all, 'resolve', 'rebind.test')
    await expectFail(all, 'dns', '203.0.113.53', 'udp', 'A', 'allowed.test')
  } finally {
    await none.kill()
    await all.kill()
  }
})

test('allowInternetAccess: the internet, but not the host, its loopback, metadata or private ranges', { skip }, async () => {
  const onHost = await hostListener('203.0.113.2')
  const onLoopback = await hostListener('127.0.0.1')
  const sbx = await create({ allowInternetAccess: true })
  try {
    assert.equal((await sbx.getInfo()).allowInternetAccess, true)
    await expectOK(sbx, /hello from 203\.0\.113\.10 for allowed\.test/, 'http', 'http://allowed.test/')
    await expectOK(sbx, /hello from 203\.0\.113\.10 for allowed\.test/, 'http', 'https://allowed.test/')
    await expectOK(sbx, /banner from 203\.0\.113\.30/, 'tcp', '203.0.113.30', '7000')
    await expectFail(sbx, 'tcp', '203.0.113.2', String(onHost.port))
    await expectFail(sbx, 'tcp', '10.99.0.5', '80')
    await expectFail(sbx, 'tcp', '169.254.169.254', '80')
    await expectFail(sbx, 'resolve', 'rebind.test')
    // DNS only through the sandbox's own resolver.
    await expectFail(sbx, 'dns', '203.0.113.53', 'udp', 'A', 'allowed.test')
    await expectFail(sbx, 'tcp', '203.0.113.53', '53')
    assert.equal(onHost.accepted(), 0, 'the host heard from the sandbox')
    assert.equal(onLoopback.accepted(), 0, "the host's loopback heard from the sandbox")
  } finally {
    await sbx.kill()
    onHost.close()
    onLoopback.close()
  }
})

test('allowOut by name and by address, nothing else', { skip }, async () => {
  const sbx = await create({ network: { allowOut: ['allowed.test', '198.51.100.0/24'] } })
  try {
    await expectOK(sbx, /for allowed\.test/, 'http', 'http://allowed.test/')
    await expectOK(sbx, /for allowed\.test/, 'http', 'https://allowed.test/')
    await expectOK(sbx, /banner from 198\.51\.100\.7/, 'tcp', '198.51.100.7', '7000')
    await expectFail(sbx, 'resolve', 'denied.test')
    await expectFail(sbx, 'tcp', '203.0.113.20', '80')
    await expectFail(sbx, 'tcp', '203.0.113.30', '7000')
    // The allowed name's address, asked for another name: cut.
    await expectOK(sbx, /200 OK/, 'sni', '203.0.113.10', 'allowed.test')
    await expectFail(sbx, 'sni', '203.0.113.10', 'other.test')
    // The allowed name presented to an address it did not resolve to.
    await expectFail(sbx, 'sni', '203.0.113.30', 'allowed.test')
    // Every request of a plain HTTP connection is judged, not the first.
    await expectOK(sbx, /^OK 200 403$/, 'keepalive', '203.0.113.10', 'allowed.test', 'other.test')
    const info = await sbx.getInfo()
    assert.equal(info.allowInternetAccess, false)
    assert.deepEqual(info.network.allowOut, ['allowed.test', '198.51.100.0/24'])
  } finally {
    await sbx.kill()
  }
})

test('denyOut alone, by address and by name: the internet less it', { skip }, async () => {
  const sbx = await create({ network: { denyOut: ['203.0.113.20', 'other.test', 'denied.test'] } })
  try {
    await expectOK(sbx, /for allowed\.test/, 'http', 'http://allowed.test/')
    await expectOK(sbx, /banner from 198\.51\.100\.7/, 'tcp', '198.51.100.7', '7000')
    await expectFail(sbx, 'tcp', '203.0.113.20', '7000')
    await expectFail(sbx, 'resolve', 'other.test')
    await expectFail(sbx, 'sni', '203.0.113.30', 'other.test')
    // Nor behind an alias, nor without a name to check.
    await expectFail(sbx, 'resolve', 'alias.test')
    await expectFail(sbx, 'sni', '203.0.113.30', '-')
    await expectOK(sbx, /^OK 200 403$/, 'keepalive', '203.0.113.30', 'allowed.test', 'other.test')
  } finally {
    await sbx.kill()
  }
})

// DNS tunnelling: code that may not reach a name encodes what it wants
// out in the names it looks up, for whoever answers them to read. The
// lab's DNS server writes down every name it is asked
// (AIRLOCK_LAB_DNS_LOG): a name the policy cannot let the sandbox reach
// must never get there, whatever the policy's shape, the query's type,
// transport or destination. With the internet open a name is forwarded,
// as any resolver would: there DNS is a channel out as HTTP is, which the
// first case shows the log sees.
const asked = () => readFileSync(process.env.AIRLOCK_LAB_DNS_LOG, 'utf8')
const leaked = (tag) => asked().split('\n').filter((l) => l.includes(tag))

async function tunnel(sbx, tag) {
  await probe(sbx, 'resolve', `${tag}-r.tunnel.test`)
  // Many names, every type, UDP and TCP, to the sandbox's resolver and to
  // the lab's DNS server and another host of the internet.
  await expectOK(sbx, /^OK sent \d+/, 'tunnel', tag, 'tunnel.test', '8', '203.0.113.53', '198.51.100.7')
  for (const proto of ['udp', 'tcp']) await probe(sbx, 'dns', '-', proto, 'TXT', `${tag}-t${proto}.tunnel.test`)
}

// [what, create options, names below tunnel.test forwarded, allowed.test resolves]
const internetShapes = [
  ['the internet', { allowInternetAccess: true }, true, true],
  ['sealed', { allowInternetAccess: false }, false, false],
  ['denyOut an address, alone', { network: { denyOut: ['203.0.113.20'] } }, true, true],
  ['allowOut ALL_TRAFFIC over denyOut ALL_TRAFFIC', { network: { denyOut: [ALL_TRAFFIC], allowOut: [ALL_TRAFFIC] } }, true, true],
  ['allowOut names', { network: { allowOut: ['allowed.test', '*.cdn.test'] } }, false, true],
  ['allowOut an address', { network: { allowOut: ['198.51.100.0/24'] } }, false, false],
  // E2B's allowlist recipe, as e2b <= 2.45, the Python SDK and the CLI
  // send it: allow_internet_access true on every create.
  ["E2B's recipe: the internet, denyOut 0.0.0.0/0, allowOut names", { allowInternetAccess: true, network: { denyOut: ['0.0.0.0/0'], allowOut: ['allowed.test'] } }, false, true],
  ['the internet, denyOut its halves, allowOut an address', { allowInternetAccess: true, network: { denyOut: ['0.0.0.0/1', '128.0.0.0/1'], allowOut: ['198.51.100.7'] } }, false, false],
  ['denyOut *.tunnel.test on the internet', { allowInternetAccess: true, network: { denyOut: ['*.tunnel.test'] } }, false, true],
]

test('DNS tunnelling: a name the policy cannot reach never reaches a resolver outside, whatever the shape', { skip }, async () => {
  const secret = 'x' + randomBytes(8).toString('hex')
  for (const [i, [what, opts, forwarded, resolves]] of internetShapes.entries()) {
    const tag = `${secret}-${i}`
    const sbx = await create(opts)
    try {
      await tunnel(sbx, tag)
      if (resolves) await expectOK(sbx, /203\.0\.113\.10/, 'resolve', 'allowed.test')
      else await expectFail(sbx, 'resolve', 'allowed.test')
      if (forwarded) {
        assert.ok(leaked(tag).length > 0, `${what}: the lab's resolver saw no name (the log works?)`)
      } else {
        assert.deepEqual(leaked(tag), [], `${what}: names reached the lab's resolver`)
      }
    } finally {
      await sbx.kill()
    }
  }
})

test('DNS tunnelling after updateNetwork from one shape to another', { skip }, async () => {
  const secret = 'u' + randomBytes(8).toString('hex')
  // What updateNetwork sends for a shape's create options: as on a
  // create, what it leaves out is E2B's default (the internet).
  const body = (opts) => ({ ...('allowInternetAccess' in opts && { allowInternetAccess: opts.allowInternetAccess }), ...(opts.network ?? {}) })
  const shapes = internetShapes
  for (const [i, [from, fromOpts]] of shapes.entries()) {
    // Each shape to the next, and the last to the first: every shape is
    // reached from another once.
    const [to, toOpts, forwarded] = shapes[(i + 1) % shapes.length]
    const sbx = await create(fromOpts)
    try {
      await sbx.updateNetwork(body(toOpts))
      const tag = `${secret}-${i}`
      await tunnel(sbx, tag)
      if (forwarded) {
        assert.ok(leaked(tag).length > 0, `${from} → ${to}: the lab's resolver saw no name (the log works?)`)
      } else {
        assert.deepEqual(leaked(tag), [], `${from} → ${to}: names reached the lab's resolver`)
      }
    } finally {
      await sbx.kill()
    }
  }
})

test("an older SDK's allowlist (e2b 2.45: allow_internet_access on every create) opens no DNS tunnel", { skip }, async () => {
  const { Sandbox: Old } = await import('e2b-245')
  const tag = 'o' + randomBytes(8).toString('hex')
  const sbx = await Old.create({ timeoutMs: 60_000, network: { denyOut: ['0.0.0.0/0'], allowOut: ['allowed.test'] } })
  try {
    await sbx.files.write('/home/user/probe.py', probeScript)
    await sbx.files.write('/home/user/lab-ca.pem', readFileSync(process.env.AIRLOCK_LAB_CA, 'utf8'))
    assert.equal((await sbx.getInfo()).allowInternetAccess, true, 'the old SDK asked for the internet')
    await expectOK(sbx, /for allowed\.test/, 'http', 'https://allowed.test/')
    await tunnel(sbx, tag)
    assert.deepEqual(leaked(tag), [], 'names reached the lab\'s resolver')
  } finally {
    await sbx.kill()
  }
})

// In Kubernetes the resolver's upstream is the cluster's DNS: from a
// sandbox, SRV and TXT lookups under cluster.local would list its
// services. Names of the host's network never leave it, whatever the
// policy (here the internet, with allowOut naming them too).
test("names of the host's network (cluster, search domains, local zones) never leave the host", { skip }, async () => {
  const tag = 'z' + randomBytes(8).toString('hex')
  const sbx = await create({ allowInternetAccess: true, network: { allowOut: ['*.cluster.local', '*.corp.test', '*.svc', '*.internal'] } })
  try {
    for (const zone of ['default.svc.cluster.local', 'cluster.local', 'svc', 'corp.test', 'internal', 'local', 'home.arpa', 'localhost', '-']) {
      await expectOK(sbx, /^OK sent \d+/, 'tunnel', tag, zone, '2')
    }
    await expectFail(sbx, 'resolve', `${tag}.default.svc.cluster.local`)
    for (const [type, name] of [['SRV', `_https._tcp.${tag}.default.svc.cluster.local`], ['PTR', '5.0.99.10.in-addr.arpa'],
      ['TXT', '5.0.99.10.in-addr.arpa'], ['SOA', '10.in-addr.arpa'], ['PTR', '10.0.96.10.in-addr.arpa']]) {
      for (const proto of ['udp', 'tcp']) await expectOK(sbx, /^OK rcode 3 answers 0$/, 'dns', '-', proto, type, name)
    }
    // A public name that aliases a name in the cluster: refused.
    for (const proto of ['udp', 'tcp']) await expectOK(sbx, /^OK rcode 3 answers 0$/, 'dns', '-', proto, 'A', 'cluster-alias.test')
    // A public name still resolves: the log sees what goes out.
    await expectOK(sbx, /203\.0\.113\.10/, 'resolve', 'allowed.test')
    assert.deepEqual(leaked(tag), [], "names of the host's network reached the lab's resolver")
    assert.deepEqual(asked().split('\n').filter((l) => /\b(10|0\.99\.10|10\.0\.96\.10)\.in-addr\.arpa$/.test(l)), [], 'reverse names of private addresses reached it')
  } finally {
    await sbx.kill()
  }
})

// A sandbox's DNS and connection floods cost the daemon's CPU, which no
// cgroup is charged for: the host's nftables rules cut them at the
// sandbox's rates before they reach its resolver and proxy. Counted from
// inside: every query that reaches the resolver is answered, every SYN
// that reaches the proxy's listener is connected. The rates are per hour,
// so nothing refills during the test; the neighbour's budget is its own.
test('DNS and connection floods are cut at the sandbox\'s rates; its neighbour is unaffected', { skip }, async () => {
  const saved = { ...process.env }
  const dir = mkdtempSync(join(tmpdir(), 'airlock-net-flood-'))
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ network: { dns: [labDNS], dnsRate: '10/h', connectionRate: '10/h' },
    templates: { base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 } } }))
  const limited = await startServer(['--config', join(dir, 'config.json')])
  // A bucket of at most the rate plus its burst (twice 10/h): kernels
  // differ in which (6.18 lets exactly the burst through).
  const most = 10 + 20 + 1
  try {
    const flooder = await create({ allowInternetAccess: true })
    const neighbour = await create({ allowInternetAccess: true })
    try {
      const out = await probe(flooder, 'flood', '300')
      const [, dns, tcp] = out.match(/^OK dns (\d+) tcp (\d+)$/) ?? assert.fail(out)
      console.log(`flood: ${dns} of 300 DNS queries and ${tcp} of 300 connections reached the daemon`)
      assert.ok(+dns > 0 && +dns <= most, `${dns} of 300 DNS queries reached the flooder's resolver, want 1 to ${most}`)
      assert.ok(+tcp > 0 && +tcp <= most, `${tcp} of 300 connections reached the flooder's proxy, want 1 to ${most}`)
      await expectOK(neighbour, /^OK dns 10 tcp 10$/, 'flood', '10')
    } finally {
      await flooder.kill()
      await neighbour.kill()
    }
  } finally {
    await limited.stop()
    Object.assign(process.env, saved)
    rmSync(dir, { recursive: true, force: true })
  }
})

test('two sandboxes cannot reach each other', { skip }, async () => {
  const a = await create({ allowInternetAccess: true })
  const b = await create({ allowInternetAccess: true })
  try {
    await a.commands.run('cd /home/user && python3 -c "import socket,time; s=socket.socket(); s.bind((\'0.0.0.0\', 8000)); s.listen(); c,_=s.accept(); c.send(b\'hi from a\'); time.sleep(1)"', { background: true })
    await sleep(500)
    const ip = (await probe(a, 'myip')).split(' ')[1]
    assert.match(ip, /^\d+\.\d+\.\d+\.\d+$/)
    await expectFail(b, 'tcp', ip, '8000')
    await expectOK(a, /hi from a/, 'tcp', '127.0.0.1', '8000')
  } finally {
    await a.kill()
    await b.kill()
  }
})

test('updateNetwork changes a running sandbox at once, open connections included', { skip }, async () => {
  const sbx = await create({ allowInternetAccess: true })
  try {
    await expectOK(sbx, /banner/, 'tcp', '198.51.100.7', '7000')
    // A connection opened before the change, used after it.
    const held = await sbx.commands.run(String.raw`python3 -c "
import socket, os, time
s = socket.create_connection(('203.0.113.10', 80), timeout=5)
s.sendall(b'GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n'); s.recv(500)
open('/tmp/ready', 'w').close()
while not os.path.exists('/tmp/go'): time.sleep(0.05)
try:
    s.sendall(b'GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n'); print('second request:', s.recv(500)[:15])
except Exception as e: print('second request failed:', type(e).__name__)
"`, { background: true })
    for (let i = 0; i < 100 && !(await sbx.files.exists('/tmp/ready')); i++) await sleep(50)
    await sbx.updateNetwork({ allowOut: ['allowed.test'] })
    await sbx.files.write('/tmp/go', '')
    const done = await held.wait()
    assert.match(done.stdout, /second request failed|second request: b''/, done.stdout)

    await expectOK(sbx, /for allowed\.test/, 'http', 'http://allowed.test/')
    await expectFail(sbx, 'tcp', '198.51.100.7', '7000')
    assert.deepEqual((await sbx.getInfo()).network.allowOut, ['allowed.test'])
    await sbx.updateNetwork({ allowInternetAccess: false })
    await expectFail(sbx, 'http', 'http://allowed.test/')
    await sbx.updateNetwork({ allowInternetAccess: true })
    await expectOK(sbx, /banner/, 'tcp', '198.51.100.7', '7000')
  } finally {
    await sbx.kill()
  }
  // A sealed sandbox opens and closes again, and updateNetwork({}),
  // clearing every rule, is the internet.
  const sealed = await create({ allowInternetAccess: false })
  try {
    await expectFail(sealed, 'tcp', '198.51.100.7', '7000')
    await sealed.updateNetwork({ allowInternetAccess: true })
    await expectOK(sealed, /banner from 198\.51\.100\.7/, 'tcp', '198.51.100.7', '7000')
    await expectOK(sealed, /for allowed\.test/, 'http', 'http://allowed.test/')
    assert.equal((await sealed.getInfo()).allowInternetAccess, true)
    await sealed.updateNetwork({ allowInternetAccess: false })
    await expectFail(sealed, 'tcp', '198.51.100.7', '7000')
    await expectFail(sealed, 'resolve', 'allowed.test')
    assert.equal((await sealed.getInfo()).allowInternetAccess, false)
    await sealed.updateNetwork({})
    await expectOK(sealed, /banner from 198\.51\.100\.7/, 'tcp', '198.51.100.7', '7000')
  } finally {
    await sealed.kill()
  }
})

// network.default "none" seals the server: no interface by default, and
// a request for the internet is refused, naming the setting.
test('a sealed server refuses the internet with a 400 naming network.default', { skip }, async () => {
  const saved = { ...process.env }
  const dir = mkdtempSync(join(tmpdir(), 'airlock-net-sealed-'))
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ network: { default: 'none', dns: [labDNS] },
    templates: { base: { poolSize: 1 }, 'code-interpreter-v1': { poolSize: 0 } } }))
  const sealedServer = await startServer(['--config', join(dir, 'config.json')])
  try {
    const refusal = /400.*network\.default "none"/
    await assert.rejects(Sandbox.create({ allowInternetAccess: true }), refusal)
    await assert.rejects(Sandbox.create({ network: { denyOut: ['203.0.113.20'] } }), refusal)
    const res = await api('POST', '/v2/sandboxes', { templateID: 'base', allow_internet_access: true })
    assert.equal(res.status, 400)
    assert.match((await res.json()).message, /network\.default "none"/)
    const sbx = await create()
    try {
      assert.equal((await sbx.getInfo()).allowInternetAccess, false)
      await expectFail(sbx, 'tcp', '198.51.100.7', '7000')
      const links = await sbx.commands.run('cat /proc/net/dev')
      assert.doesNotMatch(links.stdout, /eth0/, 'no interface but loopback')
      await assert.rejects(sbx.updateNetwork({ allowInternetAccess: true }), refusal)
    } finally {
      await sbx.kill()
    }
    // An allowlist is not the internet.
    const listed = await create({ network: { allowOut: ['allowed.test'] } })
    try {
      await expectOK(listed, /for allowed\.test/, 'http', 'http://allowed.test/')
      await expectFail(listed, 'tcp', '198.51.100.7', '7000')
    } finally {
      await listed.kill()
    }
  } finally {
    await sealedServer.stop()
    Object.assign(process.env, saved)
    rmSync(dir, { recursive: true, force: true })
  }
})

// resolvesLocalhost says whether the host's C library resolves names
// under localhost (nss-myhostname, or systemd-resolved).
function resolvesLocalhost() {
  const hosts = readFileSync('/etc/nsswitch.conf', 'utf8').split('\n').find((l) => /^\s*hosts:/.test(l)) ?? ''
  return /\b(myhostname|resolve)\b/.test(hosts)
}

// A request through the gateway by host name, as getHost(port) gives it.
function viaGateway(host, headers = {}) {
  const url = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((ok, fail) => {
    const req = request({ host: url.hostname, port: url.port, path: '/hello.txt', headers: { host, ...headers } }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => ok({ status: res.statusCode, body }))
    })
    req.on('error', fail)
    req.end()
  })
}

test('a web server in a sandbox answers through getHost(port); a private one needs the traffic token', { skip }, async () => {
  const pub = await create()
  const priv = await create({ network: { allowPublicTraffic: false } })
  try {
    for (const sbx of [pub, priv]) {
      await sbx.files.write('/home/user/hello.txt', `hello from ${sbx.sandboxId}`)
      await sbx.commands.run('cd /home/user && python3 -m http.server 8000 --bind 127.0.0.1', { background: true })
    }
    let res
    for (let i = 0; i < 50; i++) {
      res = await viaGateway(pub.getHost(8000))
      if (res.status === 200) break
      await sleep(100)
    }
    assert.equal(res.status, 200, res.body)
    assert.equal(res.body, `hello from ${pub.sandboxId}`)
    assert.match(pub.getHost(8000), new RegExp(`^8000-${pub.sandboxId}\\.`))
    // As it is, by a client that asks the C library for the name (Node's
    // fetch, Python's urllib): nss-myhostname resolves names under
    // localhost, and make deps installs it.
    if (resolvesLocalhost()) {
      const direct = await fetch(`http://${pub.getHost(8000)}/hello.txt`)
      assert.equal(await direct.text(), `hello from ${pub.sandboxId}`)
    } else {
      console.log('# getHost fetched as it is: skipped, /etc/nsswitch.conf has no myhostname (apt-get install libnss-myhostname)')
    }

    res = await viaGateway(priv.getHost(8000))
    assert.equal(res.status, 401, res.body)
    assert.match(res.body, /traffic access token/)
    for (let i = 0; i < 50; i++) {
      res = await viaGateway(priv.getHost(8000), { 'e2b-traffic-access-token': priv.trafficAccessToken })
      if (res.status === 200) break
      await sleep(100)
    }
    assert.equal(res.status, 200, res.body)
    assert.equal(res.body, `hello from ${priv.sandboxId}`)
    res = await viaGateway(pub.getHost(8001))
    assert.equal(res.status, 502)
    assert.match(res.body, /no server listens on port 8001/)
  } finally {
    await pub.kill()
    await priv.kill()
  }
})

test('network options Airlock does not implement are refused, naming the field', { skip }, async () => {
  // Request rules are implemented (egress.test.mjs); one that names a
  // secret that does not exist is refused, naming it.
  await assert.rejects(Sandbox.create({ network: { rules: { 'api.example.com': [{ transform: { headers: { A: '${e2b.secrets.nope}' } } }] } } }), /no secret named "nope"/)
  await assert.rejects(Sandbox.create({ network: { egressProxy: { address: 'proxy.test:1080' } } }), /network\.egressProxy/)
  await assert.rejects(Sandbox.create({ network: { allowOut: ['::/0'] } }), /IPv6/)
  await assert.rejects(Sandbox.create({ network: { allowOut: ['not a name'] } }), /allowOut/)
})

test('nothing of a sandbox network outlives the sandbox', { skip }, async () => {
  // Without a pool: a pooled sandbox's network is made before its claim.
  assert.equal((await api('PUT', '/airlock/pools/base', { size: 0 })).status, 204)
  await sleep(500)
  const links = await settled(sandboxLinks)
  const elements = sandboxElements()
  try {
    const sbx = await create({ allowInternetAccess: true })
    assert.equal(sandboxLinks().length, links.length + 1)
    assert.equal(sandboxElements().length, elements.length + 8) // 3 map and 3 set elements, its flood map element and chain
    await sbx.kill()
    assert.deepEqual(sandboxElements(), elements)
    assert.deepEqual(await settled(sandboxLinks, links), links)
  } finally {
    assert.equal((await api('DELETE', '/airlock/pools/base')).status, 204)
  }
})

// SDKs around 2.45 send allow_internet_access: true on every create, as
// E2B's default is the internet: with their defaults a sandbox gets it.
// A server that gives sandboxes no network refuses them, naming the
// field and how to do without.
test('an older SDK (e2b 2.45.0) creates with its defaults', { skip }, async () => {
  const { Sandbox: Old } = await import('e2b-245')
  const sbx = await Old.create({ timeoutMs: 60_000 })
  try {
    await sbx.files.write('/home/user/probe.py', probeScript)
    await sbx.files.write('/home/user/lab-ca.pem', readFileSync(process.env.AIRLOCK_LAB_CA, 'utf8'))
    await expectOK(sbx, /for allowed\.test/, 'http', 'http://allowed.test/')
    await expectFail(sbx, 'http', 'http://169.254.169.254/')
  } finally {
    await sbx.kill()
  }
  const saved = { ...process.env }
  const dir = mkdtempSync(join(tmpdir(), 'airlock-net-off-'))
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ network: { disabled: true }, templates: { base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 } } }))
  const off = await startServer(['--config', join(dir, 'config.json')])
  try {
    await assert.rejects(Old.create(), /allowInternetAccess.*false/)
    const s = await Old.create({ allowInternetAccess: false })
    assert.equal((await s.commands.run('echo isolated')).stdout, 'isolated\n')
    await s.kill()
  } finally {
    await off.stop()
    Object.assign(process.env, saved)
    rmSync(dir, { recursive: true, force: true })
  }
})

// Networked sandboxes lose nothing on gVisor: paused to disk, snapshotted
// and forked, each copy runs in a network of its own (new addresses, the
// same policy), which an updateNetwork of one copy changes for it alone.
// A pause that keeps only the files keeps the network too, on both
// backends.
const gvisor = process.env.AIRLOCK_TEST_BACKEND === 'gvisor'
// The sandboxes waiting in pools, once every pool is full.
async function pooledSandboxes() {
  for (let i = 0; ; i++) {
    const r = await fetch(process.env.E2B_API_URL + '/airlock/pools', { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
    const { pools } = await r.json()
    if (pools.every((p) => p.ready === p.size) || i > 300) return pools.reduce((n, p) => n + p.ready, 0)
    await sleep(100)
  }
}

test('a networked sandbox paused to disk, snapshotted and forked: each copy in a network of its own, under its policy', { skip: skip || (!gvisor && 'pause to disk, snapshots and fork are gVisor\'s'), timeout: 300_000 }, async () => {
  const sbx = await create({ network: { denyOut: ['198.51.100.7'] } })
  const all = [sbx]
  try {
    await expectOK(sbx, /for allowed\.test/, 'http', 'https://allowed.test/')
    await expectFail(sbx, 'tcp', '198.51.100.7', '7000')
    await sbx.commands.run('echo kept > /home/user/state')
    const address = async (s) => (await s.commands.run("python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('203.0.113.10', 80)); print(s.getsockname()[0])\"")).stdout.trim()
    const before = await address(sbx)

    // Paused to disk: its interface goes with its box; resumed, in a new
    // network under the same policy.
    assert.equal(await sbx.pause(), true)
    const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
    assert.equal((await back.commands.run('cat /home/user/state')).stdout, 'kept\n')
    await expectOK(back, /for allowed\.test/, 'http', 'https://allowed.test/')
    await expectFail(back, 'tcp', '198.51.100.7', '7000')
    assert.match(await address(back), /^\d+\.\d+\.\d+\.\d+$/, `before the pause: ${before}`)

    // Forked: three copies, each its own address, the same rules.
    const forks = await back.fork({ count: 3, timeoutMs: 120_000 })
    all.push(...forks)
    const addrs = new Set([await address(back)])
    for (const f of forks) {
      await f.files.write('/home/user/probe.py', probeScript)
      assert.equal((await f.commands.run('cat /home/user/state')).stdout, 'kept\n')
      await expectOK(f, /for allowed\.test/, 'http', 'https://allowed.test/')
      await expectFail(f, 'tcp', '198.51.100.7', '7000')
      addrs.add(await address(f))
    }
    assert.equal(addrs.size, 4, `the copies share addresses: ${[...addrs]}`)
    // One copy's network changes; the others' stay.
    await forks[0].updateNetwork({ allowOut: ['198.51.100.7'], denyOut: [ALL_TRAFFIC] })
    await expectOK(forks[0], /banner from 198\.51\.100\.7/, 'tcp', '198.51.100.7', '7000')
    await expectFail(forks[0], 'http', 'https://allowed.test/')
    await expectFail(forks[1], 'tcp', '198.51.100.7', '7000')
    await expectOK(forks[1], /for allowed\.test/, 'http', 'https://allowed.test/')
    await expectFail(back, 'tcp', '198.51.100.7', '7000')

    // A snapshot: a sandbox started from it has the network it asks for.
    const snap = await back.createSnapshot({ name: 'net-snap' })
    try {
      const open = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 })
      all.push(open)
      await open.files.write('/home/user/lab-ca.pem', readFileSync(process.env.AIRLOCK_LAB_CA, 'utf8'))
      await expectOK(open, /banner from 198\.51\.100\.7/, 'tcp', '198.51.100.7', '7000')
      const sealed = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000, allowInternetAccess: false })
      all.push(sealed)
      await expectFail(sealed, 'tcp', '198.51.100.7', '7000')
      await expectFail(sealed, 'resolve', 'allowed.test')
    } finally {
      await Sandbox.deleteSnapshot(snap.snapshotId)
    }
  } finally {
    for (const s of all) await s.kill().catch(() => {})
  }
  // What is left with a veth: the pools' sandboxes, and only they.
  const pooled = await pooledSandboxes()
  assert.equal((await settled(sandboxLinks, Array(pooled))).length, pooled, `veths outlived their sandboxes: ${sandboxLinks()}`)
})

test('a pause that keeps only the files keeps the network and its policy', { skip, timeout: 300_000 }, async () => {
  const sbx = await create({ network: { denyOut: ['198.51.100.7'] } })
  try {
    await sbx.commands.run('echo kept > /home/user/state')
    assert.equal(await sbx.pause({ keepMemory: false }), true)
    const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
    assert.equal((await back.commands.run('cat /home/user/state')).stdout, 'kept\n')
    await expectOK(back, /for allowed\.test/, 'http', 'https://allowed.test/')
    await expectFail(back, 'tcp', '198.51.100.7', '7000')
  } finally {
    await sbx.kill().catch(() => {})
  }
})

// Nothing of a networked sandbox's networks outlives it: not after 100
// pauses and resumes, not after the daemon is killed in the middle of a
// restore and started again.
test('100 pause/resume cycles of a networked sandbox, then kill -9 mid-restore: nothing of its networks is left', { skip: skip || (!gvisor && 'pause to disk is gVisor\'s'), timeout: 600_000 }, async () => {
  const baseline = { links: await pooledSandboxes(), elements: sandboxElements().length }
  const saved = { ...process.env }
  const config = { network: { dns: [labDNS] }, templates: { base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 }, jail: { poolSize: 0 } } }
  let own = await startServer([], { config })
  try {
    const sbx = await create({ network: { denyOut: ['198.51.100.7'] } })
    const elements = sandboxElements().length // the host's, and this sandbox's
    for (let i = 0; i < 100; i++) {
      assert.equal(await sbx.pause(), true)
      await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
    }
    await expectOK(sbx, /for allowed\.test/, 'http', 'https://allowed.test/')
    await expectFail(sbx, 'tcp', '198.51.100.7', '7000')
    assert.equal((await settled(sandboxLinks, Array(baseline.links + 1))).length, baseline.links + 1, `after 100 cycles: ${sandboxLinks()}`)
    assert.equal(sandboxElements().length, elements, 'nftables elements after 100 cycles')

    // Killed while it restores: the next start removes what the restore
    // had made, and the sandbox comes back from its saved state.
    assert.equal(await sbx.pause(), true)
    const restoring = Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 }).catch(() => {})
    await sleep(60)
    await own.crash()
    await restoring
    own = await startServer([], { config, stateDir: own.stateDir, apiKey: own.apiKey })
    const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
    await expectOK(back, /for allowed\.test/, 'http', 'https://allowed.test/')
    await expectFail(back, 'tcp', '198.51.100.7', '7000')
    await back.kill()
  } finally {
    await own.stop()
    Object.assign(process.env, saved)
  }
  assert.equal((await settled(sandboxLinks, Array(baseline.links))).length, baseline.links, `veths left: ${sandboxLinks()}`)
  assert.equal(sandboxElements().length, baseline.elements, 'nftables elements left')
})
