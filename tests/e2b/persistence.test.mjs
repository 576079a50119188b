// Pause to disk through the SDK: a sandbox with a running Jupyter context,
// a file and a background process is paused (its memory freed: no process
// of it is left), the daemon is killed with SIGKILL and started again, and
// connect brings everything back, three times in a row, with the timeout
// connect asks for. Where the backend pauses in memory (namespaces) the
// sandbox cannot outlive its daemon, and the test says so.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync, readdirSync, readFileSync, existsSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { Sandbox } from '@e2b/code-interpreter'
import { Sandbox as Base } from 'e2b'
import { startServer, noFreezer } from './harness.mjs'
import { metric, poolReady } from './bench-util.mjs'

const toDisk = process.env.AIRLOCK_TEST_BACKEND === 'gvisor'
const skip = !toDisk && 'the namespaces backend pauses in memory: a paused sandbox does not outlive its daemon there'

// The server's processes whose command line names its state directory:
// runsc and its sandboxes.
function processesOf(stateDir) {
  let n = 0
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes(stateDir + '/')) n++
    } catch {}
  }
  return n
}

let server
// The servers' config files' directories, kept while servers restart.
const configDirs = []
// Every server here is open, as E2B's API is by default: the sandboxes
// have networks (closed ones included), which their saves, copies and
// restores make anew.
after(async () => {
  for (const d of configDirs) rmSync(d, { recursive: true, force: true })
  if (server) {
    const { code } = await server.stop()
    assert.equal(code, 0)
  }
})

test('pause to disk: variables, files and processes outlive a killed daemon, three times over', { skip, timeout: 300_000 }, async () => {
  const cfg = join(mkdtempSync(join(tmpdir(), 'airlock-persist-cfg-')), 'airlock.json')
  configDirs.push(dirname(cfg))
  writeFileSync(cfg, JSON.stringify({ maxSandboxes: 1 }))
  const args = ['--config', cfg, '--pool-size', '0']
  server = await startServer(args)
  const sbx = await Sandbox.create('code-interpreter-v1')
  await sbx.runCode('x = 41')
  await sbx.files.write('/home/user/kept.txt', 'kept')
  await sbx.commands.run('sleep 100000', { background: true })
  assert.ok(processesOf(server.stateDir) > 0)

  assert.equal(await sbx.pause(), true)
  assert.equal(processesOf(server.stateDir), 0, 'a paused sandbox holds no memory: no process of it is left')
  assert.equal((await sbx.getInfo()).state, 'paused')
  // It counts against no limit (maxSandboxes is 1).
  const other = await Base.create()
  await other.kill()

  for (let round = 1; round <= 3; round++) {
    await server.crash()
    server = await startServer(args, { stateDir: server.stateDir, apiKey: server.apiKey })
    const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 90_000 })
    const x = await back.runCode('x += 1; x')
    assert.equal(x.text, String(41 + round), 'the kernel and its variables')
    assert.equal(await back.files.read('/home/user/kept.txt'), 'kept')
    const ps = await back.commands.run('ps -eo args')
    assert.match(ps.stdout, /sleep 100000/, 'the background process')
    const left = (new Date((await back.getInfo()).endAt) - Date.now()) / 1000
    assert.ok(left > 60 && left <= 90, `the timeout connect asked for, not a default: ${left} s left`)
    assert.equal(await back.pause(), true)
  }

  // A corrupt checkpoint is refused, clearly, and the sandbox can still
  // be killed; nothing else is lost.
  const bundles = join(server.stateDir, 'gvisor', 'bundles')
  const [bundle] = readdirSync(bundles).filter((b) => existsSync(join(bundles, b, 'checkpoint', 'checkpoint.img')))
  writeFileSync(join(bundles, bundle, 'checkpoint', 'checkpoint.img'), 'not a checkpoint')
  await assert.rejects(Sandbox.connect(sbx.sandboxId), /could not be restored from its saved state/)
  const fresh = await Base.create()
  assert.equal((await fresh.commands.run('echo fine')).stdout, 'fine\n')
  await fresh.kill()
  assert.equal(await Base.kill(sbx.sandboxId), true)
  assert.deepEqual(readdirSync(bundles), [], 'nothing of the killed sandbox is left')
})

// restart stops the server a test before left running and starts one
// with args.
async function restart(args) {
  if (server) assert.equal((await server.stop()).code, 0)
  server = await startServer(args)
}

// The running sandbox whose copies the fork and snapshot tests make: a
// Jupyter variable, a file and a background process.
async function source() {
  const sbx = await Sandbox.create('code-interpreter-v1', { timeoutMs: 300_000 })
  await sbx.runCode('x = 1')
  await sbx.files.write('/home/user/f.txt', 'original')
  await sbx.commands.run('sleep 100000', { background: true })
  return sbx
}

test('fork x3: three running, independent copies with their own ids and tokens; the original runs on', { skip, timeout: 300_000 }, async () => {
  await restart(['--pool-size', '0'])
  const sbx = await source()
  const endAt = (await sbx.getInfo()).endAt
  const forks = await sbx.fork({ count: 3, timeoutMs: 120_000 })
  assert.equal(forks.length, 3)
  for (const f of forks) assert.ok(f instanceof Sandbox, `a fork failed: ${f}`)
  const ids = new Set([sbx.sandboxId, ...forks.map((f) => f.sandboxId)])
  assert.equal(ids.size, 4, 'every copy has an id of its own')
  for (const [i, f] of forks.entries()) {
    assert.equal((await f.runCode('x')).text, '1', 'the kernel and its variable, copied')
    assert.equal(await f.files.read('/home/user/f.txt'), 'original')
    assert.match((await f.commands.run('ps -eo args')).stdout, /sleep 100000/, 'the background process, copied')
    await f.runCode(`x = ${10 + i}`)
    await f.files.write('/home/user/f.txt', `fork ${i}`)
    const left = (new Date((await f.getInfo()).endAt) - Date.now()) / 1000
    assert.ok(left > 100 && left <= 120, `the fork's own timeout: ${left} s left`)
  }
  // Independent: what one copy changed is its own.
  for (const [i, f] of forks.entries()) {
    assert.equal((await f.runCode('x')).text, String(10 + i))
    assert.equal(await f.files.read('/home/user/f.txt'), `fork ${i}`)
  }
  assert.equal((await sbx.runCode('x')).text, '1', 'the original is untouched')
  assert.equal(await sbx.files.read('/home/user/f.txt'), 'original')
  assert.equal((await sbx.getInfo()).endAt.getTime(), endAt.getTime(), "the original's time to live is untouched")
  const tokens = new Set([sbx, ...forks].map((s) => s.envdAccessToken))
  assert.equal(tokens.size, 4, 'every copy has an access token of its own')
  await assert.rejects(Base.fork(sbx.sandboxId, { count: 101 }), /count 101 is out of range: a fork makes 1 to 100 sandboxes/)
  for (const f of forks) await f.kill()
  await sbx.kill()
})

test('a snapshot is a template: sandboxes start from it as it was, after the source is gone and the daemon restarted; a corrupt one is refused', { skip, timeout: 300_000 }, async () => {
  await restart(['--pool-size', '0'])
  const sbx = await source()
  const snap = await sbx.createSnapshot({ name: 'persist-snap' })
  assert.equal(snap.snapshotId, 'persist-snap:default')
  assert.deepEqual(snap.names, ['persist-snap:default'])
  assert.equal((await sbx.runCode('x')).text, '1', 'the source runs on')
  const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
  assert.deepEqual(listed.map((s) => s.snapshotId), ['persist-snap:default'])
  await sbx.kill()

  await server.crash()
  server = await startServer(['--pool-size', '0'], { stateDir: server.stateDir, apiKey: server.apiKey })
  for (let i = 0; i < 2; i++) {
    const s = await Sandbox.create(snap.snapshotId)
    assert.equal((await s.runCode('x')).text, '1', 'the variable, from the snapshot')
    assert.equal(await s.files.read('/home/user/f.txt'), 'original')
    assert.match((await s.commands.run('ps -eo args')).stdout, /sleep 100000/)
    assert.match((await s.getInfo()).templateId, /^persist-snap(:default)?$/)
    await s.runCode('x = 99') // a copy's own: the next starts from the snapshot again
    await s.kill()
  }

  // A snapshot is a template with a pool: a copy restored before the
  // damage below would be handed out. Empty it first (and keep it so).
  const api = (method, path, body) => fetch(server.env.E2B_API_URL + path, {
    method, headers: { 'X-API-KEY': server.apiKey, 'Content-Type': 'application/json' }, body: body && JSON.stringify(body),
  })
  const snapPools = async () => (await (await api('GET', '/airlock/pools')).json()).pools.filter((p) => p.template.startsWith('persist-snap'))
  for (const p of await snapPools()) assert.equal((await api('PUT', `/airlock/pools/${encodeURIComponent(p.template)}`, { size: 0 })).status, 204)
  for (let i = 0; (await snapPools()).some((p) => p.ready > 0 || p.starting > 0); i++) {
    assert.ok(i < 200, 'the snapshot\'s pool did not empty')
    await new Promise((r) => setTimeout(r, 100))
  }

  const dir = join(server.stateDir, 'images', 'snapshots')
  const [state] = readdirSync(dir)
  // Damaged in place, its sizes kept: runsc refuses it. Cut short: the
  // stamp does, before runsc reads it.
  const img = join(dir, state, 'checkpoint.img')
  const size = statSync(img).size
  writeFileSync(img, Buffer.alloc(size, 0x5a))
  await assert.rejects(Sandbox.create(snap.snapshotId), /no sandbox can start from snapshot persist-snap /)
  writeFileSync(img, 'not a checkpoint')
  await assert.rejects(Sandbox.create(snap.snapshotId), /no sandbox can start from snapshot persist-snap .*corrupt/)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  assert.deepEqual(await Sandbox.listSnapshots().nextItems(), [])
  assert.deepEqual(readdirSync(dir), [], 'its saved state is gone with it')
  await assert.rejects(Sandbox.create(snap.snapshotId), /persist-snap/)
})

test('namespaces: fork and snapshots are refused, naming the backend that has them', { skip: toDisk && 'gvisor has them', timeout: 120_000 }, async () => {
  await restart(['--pool-size', '0'])
  const sbx = await Base.create()
  await assert.rejects(sbx.fork({ count: 2 }), /namespaces backend cannot snapshot or fork a running sandbox.*gvisor/)
  await assert.rejects(sbx.createSnapshot(), /namespaces backend cannot snapshot or fork/)
  assert.deepEqual(await Base.listSnapshots().nextItems(), [])
  assert.equal((await sbx.commands.run('echo still here')).stdout, 'still here\n')
  await sbx.kill()
})

test('warm pool from a snapshot: the code interpreter starts as a copy of a ready kernel, its own variables and random numbers', { timeout: 300_000 }, async () => {
  // The pool's sandboxes have networks: each clone gets one of its own.
  await restart(['--pool-size', '1'])
  // The pool's first sandbox waits for the warm snapshot, then is a clone
  // of it; where the backend cannot clone (namespaces) it starts afresh.
  await poolReady(server, 'code-interpreter-v1', 1, 240_000)
  const clones = () => metric(server, 'airlock_warm_snapshot_clones_total')
  assert.equal(await clones(), toDisk ? 1 : 0)

  const boxes = []
  for (let i = 0; i < 3; i++) boxes.push(await Sandbox.create('code-interpreter-v1'))
  const seen = { random: new Set(), numpy: new Set() }
  for (const [i, s] of boxes.entries()) {
    const first = await s.runCode('import random, numpy; (random.random(), float(numpy.random.rand()))')
    assert.equal(first.error, undefined, first.error?.value)
    assert.equal(first.executionCount, 1, "a copy's first cell is its first")
    const [r, n] = JSON.parse(first.text.replace('(', '[').replace(')', ']'))
    seen.random.add(r)
    seen.numpy.add(n)
    const names = await s.runCode('sorted(n for n in globals() if not n.startswith("_"))')
    // What a kernel started afresh holds (namespaces show it): the reseed
    // leaves no name behind.
    assert.deepEqual(JSON.parse(names.text.replaceAll("'", '"')),
      ['In', 'Out', 'exit', 'get_ipython', 'matplotlib', 'numpy', 'pandas', 'quit', 'random'])
    await s.runCode(`y = ${i}`)
  }
  assert.equal(seen.random.size, 3, 'random numbers of their own')
  assert.equal(seen.numpy.size, 3, "numpy's random numbers of their own")
  for (const [i, s] of boxes.entries()) assert.equal((await s.runCode('y')).text, String(i), 'variables of their own')
  if (toDisk) assert.ok(await clones() >= 3, `every create was a clone: ${await clones()}`)
  else assert.equal(await clones(), 0, 'namespaces start afresh')
  for (const s of boxes) await s.kill()
})

test('pause keeping only the files (keepMemory: false): files outlive a killed daemon, nothing runs, on every backend', { timeout: 300_000 }, async () => {
  const cfg = join(mkdtempSync(join(tmpdir(), 'airlock-persist-cfg-')), 'airlock.json')
  configDirs.push(dirname(cfg))
  writeFileSync(cfg, JSON.stringify({ maxSandboxes: 1 }))
  const args = ['--config', cfg, '--pool-size', '0']
  await restart(args)
  const sbx = await Sandbox.create('code-interpreter-v1', { envs: { KEPT_VAR: 'kept' } })
  await sbx.runCode('x = 41')
  await sbx.files.write('/home/user/work/kept.txt', 'kept')
  await sbx.commands.run('mkdir -p /tmp/t && echo tmp > /tmp/t/f && ln -s work/kept.txt /home/user/link && chmod 600 /home/user/work/kept.txt')
  await sbx.commands.run('sleep 100000', { background: true })

  assert.equal(await sbx.pause({ keepMemory: false }), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  if (toDisk) assert.equal(processesOf(server.stateDir), 0, 'nothing of it runs')
  // It counts against no limit (maxSandboxes is 1).
  const other = await Base.create()
  await other.kill()

  for (let round = 1; round <= 3; round++) {
    await server.crash()
    server = await startServer(args, { stateDir: server.stateDir, apiKey: server.apiKey })
    const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 90_000 })
    assert.equal(await back.files.read('/home/user/work/kept.txt'), 'kept', 'the file')
    assert.equal(await back.files.read('/home/user/link'), 'kept', 'the symbolic link')
    assert.equal(await back.files.read('/tmp/t/f'), 'tmp\n', 'the files of /tmp')
    const ls = await back.commands.run('stat -c "%a %U" /home/user/work/kept.txt; echo $KEPT_VAR')
    assert.equal(ls.stdout, '600 user\nkept\n', 'modes, owner and environment')
    assert.doesNotMatch((await back.commands.run('ps -eo args')).stdout, /sleep 100000/, 'no process is kept')
    const x = await back.runCode('x')
    assert.equal(x.error?.name, 'NameError', 'a new kernel: the variable is gone')
    const left = (new Date((await back.getInfo()).endAt) - Date.now()) / 1000
    assert.ok(left > 60 && left <= 90, `the timeout connect asked for: ${left} s left`)
    await back.files.write('/home/user/work/kept.txt', 'kept')
    await back.files.write(`/home/user/round${round}`, String(round))
    if (round > 1) assert.equal(await back.files.read(`/home/user/round${round - 1}`), String(round - 1), 'what the last round wrote')
    assert.equal(await back.pause({ keepMemory: false }), true)
  }
  assert.equal(await Base.kill(sbx.sandboxId), true)
  assert.deepEqual(readdirSync(join(server.stateDir, 'saved')), [], 'nothing of the killed sandbox is left')

  // The end of its time to live pauses it the same way, when it asked so.
  const auto = await Base.create('base', { timeoutMs: 2_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
  await auto.files.write('/home/user/auto.txt', 'auto')
  await auto.commands.run('sleep 100000', { background: true })
  while ((await auto.getInfo()).state !== 'paused') await new Promise((r) => setTimeout(r, 200))
  const woke = await Base.connect(auto.sandboxId)
  assert.equal(await woke.files.read('/home/user/auto.txt'), 'auto')
  assert.doesNotMatch((await woke.commands.run('ps -eo args')).stdout, /sleep 100000/)
  await woke.kill()
})

// onResume 'reboot' (connect's memory: false), as on E2B: a paused
// sandbox comes back from its files only, nothing of what ran.
test("connect with onResume 'reboot': the files stay, the processes are gone", { skip: noFreezer, timeout: 120_000 }, async () => {
  await restart(['--pool-size', '0'])
  const sbx = await Base.create()
  try {
    await sbx.files.write('/home/user/kept.txt', 'kept')
    await sbx.commands.run('sleep 100000', { background: true })
    assert.equal(await sbx.pause(), true)
    const back = await Base.connect(sbx.sandboxId, { onResume: 'reboot' })
    assert.equal(await back.files.read('/home/user/kept.txt'), 'kept')
    assert.doesNotMatch((await back.commands.run('ps -eo args')).stdout, /sleep 100000/)
    // A plain connect keeps what runs: the contrast.
    await back.commands.run('sleep 200000', { background: true })
    assert.equal(await back.pause(), true)
    const again = await Base.connect(sbx.sandboxId)
    assert.match((await again.commands.run('ps -eo args')).stdout, /sleep 200000/)
  } finally {
    await sbx.kill()
  }
})
