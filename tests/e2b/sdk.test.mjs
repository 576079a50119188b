// The official E2B SDK (npm "e2b", pinned in package.json) against a real
// airlock serve: only E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL change.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { request as httpRequest } from 'node:http'
import { Sandbox, CommandExitError, AuthenticationError } from 'e2b'
import { startServer, sleep, noFreezer, countsCPU } from './harness.mjs'

let server
before(async () => {
  // Samples for getMetrics' history twice a second (the default is 5 s).
  server = await startServer([], { config: { metricsInterval: '500ms' } })
})
after(async () => {
  const { code, leftover } = await server.stop()
  assert.equal(code, 0, 'airlock serve exits 0 on SIGTERM')
  assert.deepEqual(leftover, [], 'no sandbox outlives the daemon')
})

test('create with metadata, envs and timeout; list and filter', async () => {
  const tag = Math.random().toString(36).slice(2)
  const a = await Sandbox.create({ metadata: { suite: tag, role: 'a' }, envs: { GREETING: 'hi' }, timeoutMs: 120_000 })
  const b = await Sandbox.create({ metadata: { suite: tag, role: 'b' } })
  try {
    const info = await a.getInfo()
    assert.deepEqual(info.metadata, { suite: tag, role: 'a' })
    assert.equal(info.templateId, 'base')
    assert.deepEqual(info.lifecycle, { onTimeout: 'kill', autoResume: false })
    const ttl = info.endAt.getTime() - Date.now()
    assert.ok(ttl > 100_000 && ttl <= 120_000, `endAt ${ttl} ms away`)

    const both = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems()
    assert.deepEqual(both.map((s) => s.sandboxId), [b.sandboxId, a.sandboxId], 'newest first, as on E2B')
    const asc = await Sandbox.list({ query: { metadata: { suite: tag } }, order: 'asc' }).nextItems()
    assert.deepEqual(asc.map((s) => s.sandboxId), [a.sandboxId, b.sandboxId], 'order: asc')
    const bStarted = (await b.getInfo()).startedAt
    const later = await Sandbox.list({ query: { metadata: { suite: tag }, startedAfter: bStarted } }).nextItems()
    assert.deepEqual(later.map((s) => s.sandboxId), [b.sandboxId], 'startedAfter')
    const onlyB = await Sandbox.list({ query: { metadata: { suite: tag, role: 'b' } } }).nextItems()
    assert.deepEqual(onlyB.map((s) => s.sandboxId), [b.sandboxId])

    const pager = Sandbox.list({ query: { metadata: { suite: tag } }, limit: 1 })
    const first = await pager.nextItems()
    assert.equal(first.length, 1)
    assert.ok(pager.hasNext)
    const second = await pager.nextItems()
    assert.equal(second.length, 1)
    assert.notEqual(first[0].sandboxId, second[0].sandboxId)

    const r = await a.commands.run('echo $GREETING')
    assert.equal(r.stdout, 'hi\n', 'envVars from create reach every process')
  } finally {
    await a.kill()
    await b.kill()
  }
})

test('commands.run: exit codes, stderr, envs, cwd, user', async () => {
  const sbx = await Sandbox.create()
  try {
    const ok = await sbx.commands.run('echo out; echo err >&2; id -un; pwd')
    assert.equal(ok.exitCode, 0)
    assert.equal(ok.stdout, 'out\nuser\n/home/user\n')
    assert.equal(ok.stderr, 'err\n')

    await assert.rejects(sbx.commands.run('echo bad >&2; exit 3'), (e) => {
      assert.ok(e instanceof CommandExitError)
      assert.equal(e.exitCode, 3)
      assert.equal(e.stderr, 'bad\n')
      return true
    })
    const env = await sbx.commands.run('echo "$A $B"; pwd', { envs: { A: '1', B: 'two words' }, cwd: '/tmp' })
    assert.equal(env.stdout, '1 two words\n/tmp\n')

    let streamed = ''
    await sbx.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (d) => { streamed += d } })
    assert.equal(streamed, '1\n2\n3\n')

    const root = await sbx.commands.run('id -u; sudo -n id -u', { user: 'root' })
    assert.equal(root.stdout, '0\n0\n')
  } finally {
    await sbx.kill()
  }
  // The jail has its user alone.
  const jail = await Sandbox.create('jail')
  try {
    await assert.rejects(jail.commands.run('true', { user: 'root' }), /not available/)
  } finally {
    await jail.kill()
  }
})

test('background command, connect, list and kill', async () => {
  const sbx = await Sandbox.create()
  try {
    const bg = await sbx.commands.run('i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.05; done', { background: true })
    const listed = await sbx.commands.list()
    assert.ok(listed.some((p) => p.pid === bg.pid), 'listed')
    await bg.disconnect()
    await sleep(200)
    assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid), 'still running after disconnect')

    let seen = ''
    const again = await sbx.commands.connect(bg.pid, { onStdout: (d) => { seen += d } })
    for (let i = 0; i < 100 && !/tick \d+/.test(seen); i++) await sleep(50)
    assert.match(seen, /tick \d+/, 'output after connect')
    assert.equal(await sbx.commands.kill(bg.pid), true)
    await assert.rejects(again.wait(), CommandExitError)
    assert.ok(!(await sbx.commands.list()).some((p) => p.pid === bg.pid), 'gone after kill')
  } finally {
    await sbx.kill()
  }
})

test('stdin: send and close', async () => {
  const sbx = await Sandbox.create()
  try {
    const cat = await sbx.commands.run('tr a-z A-Z', { background: true, stdin: true })
    await sbx.commands.sendStdin(cat.pid, 'hello ')
    await sbx.commands.sendStdin(cat.pid, 'stdin\n')
    await sbx.commands.closeStdin(cat.pid)
    const r = await cat.wait()
    assert.equal(r.stdout, 'HELLO STDIN\n')
  } finally {
    await sbx.kill()
  }
})

test('pty: a terminal with input, resize and output', async () => {
  const sbx = await Sandbox.create()
  try {
    let out = ''
    const dec = new TextDecoder()
    const pty = await sbx.pty.create({ cols: 100, rows: 30, onData: (d) => { out += dec.decode(d) } })
    await sbx.pty.resize(pty.pid, { cols: 120, rows: 40 })
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; tty; echo SUM=$((40+2)); exit\n'))
    await pty.wait()
    assert.match(out, /40 120/)
    assert.match(out, /\/dev\/pts\/\d+/)
    assert.match(out, /SUM=42/)
  } finally {
    await sbx.kill()
  }
})

test('files: write, read, list, exists, rename, makeDir, remove', async () => {
  const sbx = await Sandbox.create()
  try {
    const w = await sbx.files.write('/home/user/notes/a.txt', 'alpha')
    assert.equal(w.path, '/home/user/notes/a.txt')
    assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'alpha')
    assert.equal(await sbx.files.read('notes/a.txt'), 'alpha', 'relative paths start at home')
    await sbx.files.write([{ path: '/tmp/m1', data: 'one' }, { path: '/tmp/m2', data: new Blob(['two']) }])
    assert.equal(await sbx.files.read('/tmp/m2'), 'two')

    const entries = await sbx.files.list('/home/user/notes')
    assert.deepEqual(entries.map((e) => [e.name, e.type, e.size]), [['a.txt', 'file', 5]])
    assert.equal(await sbx.files.exists('/home/user/notes/a.txt'), true)
    assert.equal(await sbx.files.exists('/home/user/nope'), false)

    assert.equal(await sbx.files.makeDir('/home/user/d/e'), true)
    assert.equal(await sbx.files.makeDir('/home/user/d/e'), false, 'existing dir')
    const moved = await sbx.files.rename('/home/user/notes/a.txt', '/home/user/d/e/b.txt')
    assert.equal(moved.path, '/home/user/d/e/b.txt')
    const deep = await sbx.files.list('/home/user/d', { depth: 2 })
    assert.deepEqual(deep.map((e) => e.path).sort(), ['/home/user/d/e', '/home/user/d/e/b.txt'])
    await sbx.files.remove('/home/user/d')
    assert.equal(await sbx.files.exists('/home/user/d'), false)
    await sbx.files.remove('/home/user/d') // gone already: no error, as on E2B
    await assert.rejects(sbx.files.read('/home/user/d/e/b.txt'))
  } finally {
    await sbx.kill()
  }
})

// downloadUrl and uploadUrl: signed, expiring URLs that plain fetch
// (no SDK, no headers) can use; a tampered, expired or other sandbox's
// signature opens nothing, refused with envd's bodies.
test('files: signed download and upload URLs', async () => {
  const sbx = await Sandbox.create()
  const other = await Sandbox.create()
  try {
    await sbx.files.write('/home/user/signed.txt', 'for the browser')
    const url = await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 60 })
    let r = await fetch(url)
    assert.equal(r.status, 200)
    assert.equal(await r.text(), 'for the browser')
    // On the API's own origin, a download that cannot script the console.
    assert.equal(r.headers.get('content-disposition'), 'attachment; filename=signed.txt')
    assert.equal(r.headers.get('content-type'), 'application/octet-stream')
    assert.equal(r.headers.get('x-content-type-options'), 'nosniff')
    assert.match(r.headers.get('content-security-policy') ?? '', /^sandbox/)
    // It acts as the user it was signed for, whatever Authorization says.
    r = await fetch(await sbx.downloadUrl('/home/user/signed.txt', { user: 'user' }), { headers: { Authorization: 'Basic ' + btoa('root:') } })
    assert.equal(r.status, 200, 'signed for user, sent with Basic root')
    assert.equal(await r.text(), 'for the browser')
    // Refused as envd refuses: its status and its body, word for word.
    const refused = async (r, status, message, what) => {
      assert.equal(r.status, status, what)
      assert.deepEqual(await r.json(), { code: status, message }, what)
    }
    const tampered = new URL(url)
    tampered.searchParams.set('path', '/home/user/.bashrc')
    await refused(await fetch(tampered), 401, 'invalid signature', 'the signature covers its path')
    const expired = await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: -5 })
    await refused(await fetch(expired), 401, 'signature is already expired', 'an expired signature')
    await refused(await fetch(url, { method: 'POST', body: 'x' }), 401, 'invalid signature', 'a read signature does not write')
    // Another sandbox's signature, for this sandbox, opens nothing.
    const foreign = await other.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 60 })
    r = await fetch(foreign, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' } })
    await refused(r, 401, 'invalid signature', "another sandbox's signature")

    const up = await sbx.uploadUrl('/home/user/uploaded.txt', { useSignatureExpiration: 60 })
    const form = new FormData()
    form.append('file', new Blob(['sent by a browser']), 'uploaded.txt')
    r = await fetch(up, { method: 'POST', body: form })
    assert.equal(r.status, 200, await r.text())
    assert.equal(await sbx.files.read('/home/user/uploaded.txt'), 'sent by a browser')
  } finally {
    await sbx.kill()
    await other.kill()
  }
})

// The API key, however a client sends it, and the sandbox's tokens never
// reach a server in the sandbox.
test('a server in a sandbox never sees the API key', async () => {
  const sbx = await Sandbox.create()
  try {
    await sbx.files.write('/home/user/echo.py', [
      'import http.server',
      'class H(http.server.BaseHTTPRequestHandler):',
      '    def do_GET(self):',
      '        body = str(self.headers).encode()',
      '        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()',
      '        self.wfile.write(body)',
      'http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()',
    ].join('\n'))
    await sbx.commands.run('python3 /home/user/echo.py', { background: true })
    const url = new URL(process.env.E2B_SANDBOX_URL)
    const key = server.apiKey
    const get = () => new Promise((ok, fail) => {
      const headers = { host: sbx.getHost(8080), authorization: `Bearer ${key}`, 'x-api-key': key, 'x-access-token': sbx.envdAccessToken ?? '', 'x-echo': 'passed' }
      const req = httpRequest({ host: url.hostname, port: url.port, path: '/', headers }, (res) => {
        let body = ''
        res.on('data', (d) => { body += d })
        res.on('end', () => ok({ status: res.statusCode, body }))
      })
      req.on('error', fail)
      req.end()
    })
    let res
    for (let i = 0; i < 50; i++) {
      res = await get()
      if (res.status === 200) break
      await sleep(100)
    }
    assert.equal(res.status, 200, res.body)
    assert.match(res.body, /x-echo: passed/i, 'the server echoes what it got')
    assert.ok(!res.body.includes(key), `the server got the API key:\n${res.body}`)
    assert.doesNotMatch(res.body, /authorization|x-api-key|x-access-token/i)
  } finally {
    await sbx.kill()
  }
})

test('files: a 50 MB upload and download, streamed', async () => {
  const sbx = await Sandbox.create()
  try {
    const big = Buffer.alloc(50 << 20)
    for (let i = 0; i < big.length; i += 4096) big.writeUInt32LE(i, i)
    const sha = (b) => createHash('sha256').update(b).digest('hex')
    await sbx.files.write('/home/user/big.bin', big)
    const check = await sbx.commands.run('sha256sum /home/user/big.bin')
    assert.equal(check.stdout.split(' ')[0], sha(big))
    const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' })
    assert.equal(back.length, big.length)
    assert.equal(sha(back), sha(big))
  } finally {
    await sbx.kill()
  }
})

test('watchDir reports changes, recursively', async () => {
  const sbx = await Sandbox.create()
  try {
    await sbx.files.makeDir('/home/user/w/sub')
    const events = []
    const watcher = await sbx.files.watchDir('/home/user/w', (e) => events.push(`${e.type}:${e.name}`), { recursive: true })
    await sbx.files.write('/home/user/w/top.txt', '1')
    await sbx.commands.run('echo x > /home/user/w/sub/deep.txt; rm /home/user/w/top.txt')
    for (let i = 0; i < 50 && !events.includes('remove:top.txt'); i++) await sleep(50)
    await watcher.stop()
    assert.ok(events.includes('create:top.txt'), events.join(' '))
    assert.ok(events.includes('create:sub/deep.txt'), events.join(' '))
    assert.ok(events.includes('remove:top.txt'), events.join(' '))
  } finally {
    await sbx.kill()
  }
})

// envd 0.6.2–0.6.4: file metadata kept in user.e2b.* xattrs (set on
// upload, replaced by the next one, seen by getInfo, list and watch events,
// also when sandbox code sets it), watch events carrying their entry, and
// the network-mounts flag.
test('files: metadata, watch events with their entry', async () => {
  const sbx = await Sandbox.create()
  try {
    const w = await sbx.files.write('/home/user/meta.txt', 'v1', { metadata: { author: 'ada', stage: 'draft' } })
    assert.deepEqual(w.metadata, { author: 'ada', stage: 'draft' })
    assert.deepEqual((await sbx.files.getInfo('/home/user/meta.txt')).metadata, { author: 'ada', stage: 'draft' })
    await sbx.files.write('/home/user/meta.txt', 'v2', { metadata: { author: 'grace' } })
    const [listed] = (await sbx.files.list('/home/user')).filter((e) => e.name === 'meta.txt')
    assert.deepEqual(listed.metadata, { author: 'grace' }, 'an upload replaces the set')
    await sbx.commands.run(`python3 -c "import os; os.setxattr('/home/user/meta.txt', 'user.e2b.by', b'code')"`)
    assert.deepEqual((await sbx.files.getInfo('/home/user/meta.txt')).metadata, { author: 'grace', by: 'code' })
    await assert.rejects(sbx.files.write('/home/user/meta.txt', 'v3', { metadata: { big: 'x'.repeat(5000) } }), /metadata/)
    assert.equal(await sbx.files.read('/home/user/meta.txt'), 'v2', 'a refused upload changes nothing')

    await sbx.files.makeDir('/home/user/we')
    const events = []
    const watcher = await sbx.files.watchDir('/home/user/we', (e) => events.push(e), { includeEntry: true, allowNetworkMounts: true })
    await sbx.files.write('/home/user/we/e.txt', 'hello', { metadata: { tag: 'seen' } })
    // An event carries its entry only while the file is still at its path:
    // the file stays until its events came (a removal right after the
    // write would race the watcher, on gVisor most of all).
    for (let i = 0; i < 50 && !events.some((e) => e.entry?.metadata?.tag === 'seen'); i++) await sleep(50)
    await sbx.files.remove('/home/user/we/e.txt')
    for (let i = 0; i < 50 && !events.some((e) => e.type === 'remove'); i++) await sleep(50)
    await watcher.stop()
    const created = events.find((e) => e.type === 'create' && e.name === 'e.txt')
    assert.ok(created?.entry, JSON.stringify(events))
    assert.equal(created.entry.path, '/home/user/we/e.txt')
    assert.equal(created.entry.type, 'file')
    // Setting the metadata is a change of attributes: its event's entry has it.
    assert.ok(events.some((e) => e.entry?.metadata?.tag === 'seen'), JSON.stringify(events))
    assert.ok(events.filter((e) => e.type === 'remove').every((e) => e.entry === undefined), 'a removal carries no entry')
  } finally {
    await sbx.kill()
  }
})

test('getMetrics: CPU, memory and disk in use', async () => {
  const sbx = await Sandbox.create()
  try {
    await sbx.getMetrics() // the CPU share is over the time since the last call
    await sbx.commands.run('head -c 20000000 /dev/zero > /home/user/blob && python3 -c "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"')
    const [m] = await sbx.getMetrics()
    if (countsCPU) assert.ok(m.cpuUsedPct > 30 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct} after a 1.5 s busy loop`)
    else assert.equal(m.cpuUsedPct, 0, 'no cpuacct cgroup on this host: no CPU share to report')
    assert.ok(m.memUsed > 0 && m.memUsed < m.memTotal, `memUsed ${m.memUsed} of ${m.memTotal}`)
    assert.ok(m.diskUsed >= 20_000_000 && m.diskUsed < m.diskTotal, `diskUsed ${m.diskUsed} of ${m.diskTotal}`)
    assert.equal(m.cpuCount, 1)
    // The history: the samples of a time range, oldest first.
    const start = new Date(Date.now() - 60_000)
    await sleep(1500)
    const history = await sbx.getMetrics({ start, end: new Date() })
    assert.ok(history.length >= 3, `${history.length} samples over the sandbox's life`)
    assert.ok(history.every((h, i) => i === 0 || h.timestamp >= history[i - 1].timestamp), 'oldest first')
    assert.ok(history.every((h) => h.memTotal === m.memTotal && h.memUsed > 0))
    assert.deepEqual(await sbx.getMetrics({ start: new Date(Date.now() + 60_000), end: new Date(Date.now() + 120_000) }), [], 'none in the future')
  } finally {
    await sbx.kill()
  }
})

test('pause and connect: every process stops, memory and files stay', { skip: noFreezer }, async () => {
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  try {
    await sbx.files.write('/home/user/note', 'kept')
    // A clock inside: a line every 20 ms, and a shell variable in memory.
    await sbx.commands.run('n=0; while true; do n=$((n+1)); echo "$(date +%s%3N) $n" >> /tmp/ticks; sleep 0.02; done', { background: true })
    await sleep(300)
    assert.equal(await sbx.pause(), true)
    assert.equal(await Sandbox.pause(sbx.sandboxId), false, 'pausing it again: 409, false')
    assert.equal((await sbx.getInfo()).state, 'paused')
    const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
    assert.deepEqual(paused.map((s) => s.sandboxId), [sbx.sandboxId])
    await sleep(1500)
    const again = await Sandbox.connect(sbx.sandboxId) // resumes
    assert.equal((await again.getInfo()).state, 'running')
    await sleep(300)
    const ticks = (await again.files.read('/tmp/ticks')).trim().split('\n').map((l) => l.split(' ').map(Number))
    const gaps = ticks.slice(1).map(([t], i) => t - ticks[i][0])
    assert.ok(Math.max(...gaps) >= 1400, `the clock ran while paused: largest gap ${Math.max(...gaps)} ms`)
    assert.ok(ticks.every(([, n], i) => n === i + 1), 'the loop kept its count across the pause')
    assert.equal(await again.files.read('/home/user/note'), 'kept')
  } finally {
    await sbx.kill()
  }
  // A paused sandbox can be killed; one created to pause at its timeout
  // does, and traffic resumes one that asked for it.
  const p = await Sandbox.create({ timeoutMs: 2_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    assert.deepEqual((await p.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true })
    for (let i = 0; i < 100 && (await p.getInfo()).state !== 'paused'; i++) await sleep(100)
    assert.equal((await p.getInfo()).state, 'paused', 'paused at its timeout, not killed')
    assert.equal((await p.commands.run('echo back')).stdout, 'back\n', 'traffic resumed it')
    assert.equal((await p.getInfo()).state, 'running')
    await p.pause()
  } finally {
    await p.kill()
  }
  assert.equal((await Sandbox.list({ query: { state: ['paused', 'running'] } }).nextItems()).some((s) => s.sandboxId === p.sandboxId), false)
})

test('setTimeout, TTL expiry and kill', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 60_000 })
  await sbx.setTimeout(2_000)
  const info = await sbx.getInfo()
  assert.ok(info.endAt.getTime() - Date.now() <= 2_000)
  assert.equal(await sbx.isRunning(), true)
  await sleep(3_000)
  assert.equal(await sbx.isRunning(), false, 'expired')
  const ids = (await Sandbox.list().nextItems()).map((s) => s.sandboxId)
  assert.ok(!ids.includes(sbx.sandboxId))

  const k = await Sandbox.create()
  assert.equal(await Sandbox.kill(k.sandboxId), true)
  assert.equal(await Sandbox.kill(k.sandboxId), false, 'already gone')
  assert.equal(await k.isRunning(), false)
})

test('auth: a wrong API key, a wrong token, another sandbox\'s token', async () => {
  await assert.rejects(Sandbox.create({ apiKey: 'e2b_' + '0'.repeat(40) }), AuthenticationError)
  const a = await Sandbox.create()
  const b = await Sandbox.create()
  try {
    const url = process.env.E2B_SANDBOX_URL
    const probe = (token, id) => fetch(url + '/health', {
      headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': '49983', ...(token && { 'X-Access-Token': token }) },
    }).then((r) => r.status)
    assert.equal(await probe(a.envdAccessToken, a.sandboxId), 204)
    assert.equal(await probe(undefined, a.sandboxId), 401)
    assert.equal(await probe('wrong', a.sandboxId), 401)
    assert.equal(await probe(b.envdAccessToken, a.sandboxId), 401, "b's token does not open a")

    const forged = await Sandbox.connect(a.sandboxId)
    forged.commands.envdAccessToken = 'wrong'
    const viaSdk = new Sandbox({ sandboxId: a.sandboxId, envdAccessToken: b.envdAccessToken, envdVersion: '0.5.7' })
    await assert.rejects(viaSdk.commands.run('true'))
  } finally {
    await a.kill()
    await b.kill()
  }
})

test('a burst of creates larger than the pool: every one succeeds', async () => {
  const sbxs = await Promise.all(Array.from({ length: 8 }, () => Sandbox.create({ metadata: { burst: '1' } })))
  try {
    assert.equal(new Set(sbxs.map((s) => s.sandboxId)).size, 8)
    const outs = await Promise.all(sbxs.map((s) => s.commands.run('hostname')))
    assert.ok(outs.every((r) => r.stdout === 'sandbox\n'))
  } finally {
    await Promise.all(sbxs.map((s) => s.kill()))
  }
})
