// Live restore through the official SDK: with liveRestore in the config,
// sandboxes outlive the daemon — kill -9, SIGTERM, a new binary — and the
// next start takes them back with the same ids, tokens, metadata, time
// to live and network policy, their processes and kernels never stopped;
// a paused one stays paused and resumes (on gVisor from disk, where a
// pause saves it). On both backends. Fifty restarts leave nothing
// behind (processes, mounts, cgroups, network namespaces, interfaces,
// descriptors). Run under tests/netlab: the sandboxes' network is the
// fake internet's (allowed.test, denied.test).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { copyFileSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { ALL_TRAFFIC } from 'e2b'
import { Sandbox } from '@e2b/code-interpreter'
import { startServer, sleep } from './harness.mjs'
import { pools, procTable, descendants, airlockCgroups, read, link, norm, clientSockets, listenPort } from './reliability-util.mjs'
import { metric } from './bench-util.mjs'

const labDNS = process.env.AIRLOCK_LAB_DNS
const skip = !labDNS && 'needs the fake internet: run under bin/netlab'
const config = { liveRestore: true, templates: { ...pools(1), jail: { poolSize: 0 } }, network: { dns: [labDNS] } }

let server
after(async () => {
  if (!server) return
  // Live sandboxes outlive a stopped server: killed first.
  for (const s of await Sandbox.list().nextItems().catch(() => [])) await Sandbox.kill(s.sandboxId).catch(() => {})
  const { stateDir } = server
  await server.stop()
  assert.deepEqual(keepers(stateDir), [], 'a keeper outlived its last sandbox')
})

// restart stops the server (kill -9 or SIGTERM) and starts one from bin
// on its state directory.
async function restart(how, bin) {
  if (how === 'kill') await server.crash()
  else assert.equal(await server.term(), 0)
  server = await startServer([], { config, stateDir: server.stateDir, apiKey: server.apiKey, bin })
}

// keepers: the processes that hold a state directory's sandboxes.
function keepers(stateDir) {
  return [...procTable().values()].filter((p) => {
    const argv = (read(`/proc/${p.pid}/cmdline`) ?? '').split('\0')
    return argv[1] === 'airlock-spawner' && (argv[2] ?? '').startsWith(stateDir)
  })
}

const sh = async (sbx, cmd) => (await sbx.commands.run(cmd + ' 2>&1 || echo "exit $?"')).stdout

test('running and paused sandboxes outlive kill -9, SIGTERM and a new binary', { skip, timeout: 300_000 }, async () => {
  server = await startServer([], { config })
  const sbx = await Sandbox.create({ timeoutMs: 600_000, metadata: { who: 'live' }, network: { allowOut: ['allowed.test'], denyOut: [ALL_TRAFFIC] } })
  await sbx.runCode('x = 41')
  await sbx.commands.run('sleep 100000', { background: true })
  await sbx.files.write('/home/user/kept.txt', 'kept')
  assert.match(await sh(sbx, 'curl -sS -m 5 http://allowed.test/'), /hello from 203\.0\.113\.10/)
  const paused = await Sandbox.create({ timeoutMs: 600_000 })
  await paused.runCode('y = 7')
  await paused.pause()
  const before = await Sandbox.getInfo(sbx.sandboxId)
  const token = sbx.envdAccessToken
  assert.ok(token, 'the sandbox has an access token')

  // A new binary: a copy of this build elsewhere is another executable
  // to the keeper, which then forks nothing more (adopt.go).
  const dir = mkdtempSync(join(tmpdir(), 'airlock-live-bin-'))
  const newBin = join(dir, 'airlock')
  copyFileSync(process.env.AIRLOCK_BIN ?? resolve(import.meta.dirname, '../../bin/airlock'), newBin)
  try {
    let x = 41
    for (const [how, bin] of [['kill'], ['term'], ['kill', newBin], ['term', newBin]]) {
      await restart(how, bin)
      const what = `after ${how}${bin ? ' to a new binary' : ''}`
      const back = await Sandbox.connect(sbx.sandboxId)
      assert.equal(back.envdAccessToken, token, `the same token ${what}`)
      assert.equal((await back.runCode('x += 1; x')).text, String(++x), `the kernel's variable ${what}`)
      assert.equal(await back.files.read('/home/user/kept.txt'), 'kept')
      assert.match(await sh(back, 'ps -eo args'), /sleep 100000/, `the background process ${what}`)
      const info = await Sandbox.getInfo(sbx.sandboxId)
      assert.deepEqual(info.metadata, { who: 'live' })
      assert.equal(info.endAt.getTime(), before.endAt.getTime(), `the same time to live ${what}`)
      assert.equal(info.startedAt.getTime(), before.startedAt.getTime())
      // Its policy, through a new proxy and resolver.
      assert.match(await sh(back, 'curl -sS -m 5 http://allowed.test/'), /hello from 203\.0\.113\.10/, `allowed ${what}`)
      assert.match(await sh(back, 'curl -sS -m 5 http://denied.test/'), /exit [1-9]/, `denied ${what}`)
      const states = Object.fromEntries((await Sandbox.list().nextItems()).map((s) => [s.sandboxId, s.state]))
      assert.deepEqual(states, { [sbx.sandboxId]: 'running', [paused.sandboxId]: 'paused' })
    }
    // The keeper of the first binary keeps the first sandboxes; the new
    // binary's keeper the pool it filled since.
    assert.equal(keepers(server.stateDir).length, 2, 'the old binary\'s keeper and the new one\'s')
    const resumed = await Sandbox.connect(paused.sandboxId)
    assert.equal((await resumed.runCode('y')).text, '7', 'the paused sandbox resumes with its kernel')
    await Sandbox.kill(paused.sandboxId)
    await Sandbox.kill(sbx.sandboxId)
    // With its sandboxes gone, the old keeper is too.
    for (let i = 0; keepers(server.stateDir).length > 1; i++) {
      assert.ok(i < 100, 'the old binary\'s keeper outlived its sandboxes')
      await sleep(50)
    }
    await server.term()
    server = await startServer([], { config, stateDir: server.stateDir, apiKey: server.apiKey })
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})

// census: what the server's sandboxes hold on the host, beyond the
// daemon: its keepers' processes and descriptors, the sandboxes'
// cgroups, network namespaces, interfaces and nftables elements, and the
// daemon's own descriptors (but clients' connections) and mounts.
function census() {
  const own = keepers(server.stateDir)
  const procs = own.flatMap((k) => descendants(k.pid))
  const fdsOf = (pid, skip = new Set()) => readdirSync(`/proc/${pid}/fd`).map((fd) => link(`/proc/${pid}/fd/${fd}`))
    .filter((l) => l && !(l.startsWith('socket:[') && skip.has(l.slice(8, -1)))).map(norm).sort()
  const hostNet = link('/proc/self/ns/net')
  let nft = ''
  try { nft = execFileSync('nft', ['list', 'table', 'inet', 'airlock_v1']).toString() } catch {}
  return {
    keepers: own.length,
    processes: procs.map((p) => p.comm).sort(),
    keeperFds: own.flatMap((k) => fdsOf(k.pid)),
    daemonFds: fdsOf(server.pid, clientSockets(server.pid, listenPort(server))),
    mounts: (read(`/proc/${server.pid}/mountinfo`) ?? '').split('\n').length,
    cgroups: airlockCgroups().length,
    netns: new Set(procs.map((p) => link(`/proc/${p.pid}/ns/net`)).filter((n) => n && n !== hostNet)).size,
    links: execFileSync('ip', ['-o', 'link']).toString().split('\n').filter((l) => / al-/.test(l)).length,
    nftElements: (nft.match(/al-[0-9a-f]{4}/g) ?? []).length,
  }
}

// settled waits for the base pool's one sandbox, then for two censuses
// alike (the kernel removes a dead sandbox's interface in the
// background), and returns the last.
async function settled() {
  for (let i = 0; await metric(server, 'airlock_pool_ready{template="base"}') < 1; i++) {
    assert.ok(i < 600, 'the pool did not refill')
    await sleep(50)
  }
  let last = census()
  for (let i = 0; i < 50; i++) {
    await sleep(200)
    const now = census()
    if (JSON.stringify(now) === JSON.stringify(last)) break
    last = now
  }
  return last
}

test('fifty restarts of the daemon leave nothing behind', { skip, timeout: 600_000 }, async () => {
  server ??= await startServer([], { config })
  const sbx = await Sandbox.create({ timeoutMs: 600_000, network: { allowOut: ['allowed.test'], denyOut: [ALL_TRAFFIC] } })
  await sbx.runCode('n = 0')
  await sbx.commands.run('sleep 100000', { background: true })
  let first
  const start = Date.now()
  let n = 0
  for (let i = 1; i <= 50; i++) {
    await restart(i % 2 ? 'kill' : 'term')
    if (i === 1 || i % 10 === 0) {
      const back = await Sandbox.connect(sbx.sandboxId)
      assert.equal((await back.runCode('n += 1; n')).text, String(++n), `the kernel after ${i} restarts`)
      assert.match(await sh(back, 'curl -sS -m 5 http://allowed.test/'), /hello from/, `its network after ${i} restarts`)
    }
    if (i === 1) first = await settled()
  }
  const last = await settled()
  console.log(`live restore: 50 restarts in ${((Date.now() - start) / 1000).toFixed(1)} s; held after the first and the last: ${JSON.stringify(last)}`)
  assert.deepEqual(last, first, 'what the sandboxes hold after 50 restarts, against after 1')
  assert.equal(first.keepers, 1, 'one keeper')
  await Sandbox.kill(sbx.sandboxId)
})
