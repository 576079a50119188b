// The cost of a sandbox's network, in the fake internet (run it under
// tests/netlab; `make bench-net` does): the egress path (nftables
// redirect, the daemon's proxy, its dial) against the same client run on
// the host, straight to the server, in the same run; and what a network
// adds to a cold Sandbox.create() and, on gVisor, to pause and resume,
// snapshots and forks.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox } from 'e2b'
import { startServer } from './harness.mjs'
import { pct, fmt, time, poolReady } from './bench-util.mjs'

if (!process.env.AIRLOCK_LAB_DNS) {
  console.error('bench-net needs the fake internet: run it under tests/netlab (make bench-net)')
  process.exit(2)
}

// Fresh connections, one request each; then one large download.
const client = String.raw`
import socket, sys, time
n, size = int(sys.argv[1]), int(sys.argv[2])
lat = []
for _ in range(n):
    t = time.perf_counter()
    s = socket.create_connection(("203.0.113.10", 80))
    s.sendall(b"GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n")
    while s.recv(4096):
        pass
    s.close()
    lat.append(time.perf_counter() - t)
lat.sort()
s = socket.create_connection(("203.0.113.10", 80))
s.sendall(b"GET /bytes?n=%d HTTP/1.0\r\nHost: allowed.test\r\n\r\n" % size)
t, got = time.perf_counter(), 0
while True:
    b = s.recv(1 << 20)
    if not b:
        break
    got += len(b)
print(lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000, got / (time.perf_counter() - t) / 1e6)
`
const dir = mkdtempSync(join(tmpdir(), 'airlock-bench-net-'))
const cfg = join(dir, 'config.json')
writeFileSync(cfg, JSON.stringify({ network: { dns: [process.env.AIRLOCK_LAB_DNS] }, templates: { base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 } } }))
writeFileSync(join(dir, 'client.py'), client)
// A sandbox of the E2B API has a network unless its server is sealed
// (network.default "none"): the creates without one are a sealed
// server's, started first so that the harness's environment (the SDK's
// default server) is the open one's.
const sealedCfg = join(dir, 'sealed.json')
writeFileSync(sealedCfg, JSON.stringify({ network: { default: 'none' }, templates: { base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 } } }))
const sealed = await startServer(['--config', sealedCfg])
const server = await startServer(['--config', cfg])
const on = (s) => ({ apiUrl: s.env.E2B_API_URL, apiKey: s.apiKey })
const N = 200, SIZE = 200e6
try {
  const parse = (out) => out.trim().split(' ').map(Number)
  const bare = parse(execFileSync('/usr/bin/python3', [join(dir, 'client.py'), N, SIZE]).toString())
  const sbx = await Sandbox.create({ allowInternetAccess: true })
  await sbx.files.write('/home/user/client.py', client)
  const run = async () => parse((await sbx.commands.run(`python3 /home/user/client.py ${N} ${SIZE}`, { timeoutMs: 300_000 })).stdout)
  await run() // warm
  const boxed = await run()
  await sbx.kill()

  // Cold creates, alternating, so that both see the same machine.
  const plain = [], networked = []
  for (let i = 0; i < 20; i++) {
    for (const [list, opts] of [[plain, on(sealed)], [networked, { ...on(server), allowInternetAccess: true }]]) {
      let s
      list.push(await time(async () => { s = await Sandbox.create(opts) }))
      await s.kill()
    }
  }
  // Pool claims: a server of each kind whose base keeps a pool of one,
  // claims alternating, each once its pool is full again.
  const claims = [[], []]
  const pooledServers = []
  for (const [name, extra] of [['sealed-pool', { network: { default: 'none' } }], ['open-pool', { network: { dns: [process.env.AIRLOCK_LAB_DNS] } }]]) {
    const f = join(dir, `${name}.json`)
    writeFileSync(f, JSON.stringify({ ...extra, templates: { base: { poolSize: 1 }, 'code-interpreter-v1': { poolSize: 0 }, jail: { poolSize: 0 } } }))
    pooledServers.push(await startServer(['--config', f]))
  }
  try {
    for (let i = 0; i < 30; i++) {
      for (const [k, s] of pooledServers.entries()) {
        await poolReady(s, 'base', 1)
        let sb
        claims[k].push(await time(async () => { sb = await Sandbox.create({ ...on(s), ...(k === 1 && { allowInternetAccess: true }) }) }))
        await sb.kill()
      }
    }
  } finally {
    for (const s of pooledServers) await s.stop()
  }
  const ms = (x) => `${x.toFixed(2)} ms`
  console.log(`sandbox egress (allowInternetAccess), ${N} requests on fresh connections, then ${SIZE / 1e6} MB`)
  console.log(`  HTTP request, host straight to the server  p50 ${ms(bare[0])}  p99 ${ms(bare[1])}`)
  console.log(`  HTTP request, from the sandbox             p50 ${ms(boxed[0])}  p99 ${ms(boxed[1])}   ${(boxed[0] / bare[0]).toFixed(2)}x`)
  console.log(`  download: host ${bare[2].toFixed(0)} MB/s, sandbox ${boxed[2].toFixed(0)} MB/s   ${(boxed[2] / bare[2]).toFixed(2)}x`)
  console.log(`  Sandbox.create() cold, no network (sealed) ${fmt(plain)}`)
  console.log(`  Sandbox.create() cold, allowInternetAccess ${fmt(networked)}   +${ms(pct(networked, 50) - pct(plain, 50))}`)
  console.log(`  Sandbox.create() pool claim, sealed      ${fmt(claims[0])}`)
  console.log(`  Sandbox.create() pool claim, internet    ${fmt(claims[1])}   +${ms(pct(claims[1], 50) - pct(claims[0], 50))}`)

  // On gVisor: what a network adds to saving, copying and restoring a
  // sandbox (each made anew in a network of its own), rounds alternating.
  if (process.env.AIRLOCK_TEST_BACKEND === 'gvisor') {
    const kinds = [['no network (sealed)', on(sealed)], ['allowInternetAccess', { ...on(server), allowInternetAccess: true }]]
    const rows = kinds.map(() => ({ pause: [], resume: [], snapshot: [], create: [], fork: [] }))
    for (let i = 0; i < 5; i++) {
      for (const [k, [, opts]] of kinds.entries()) {
        const r = rows[k]
        const sbx = await Sandbox.create({ ...opts, timeoutMs: 300_000 })
        r.pause.push(await time(() => sbx.pause()))
        r.resume.push(await time(() => Sandbox.connect(sbx.sandboxId, { ...opts, timeoutMs: 300_000 })))
        let snap, copy, forks
        r.snapshot.push(await time(async () => { snap = await sbx.createSnapshot() }))
        r.create.push(await time(async () => { copy = await Sandbox.create(snap.snapshotId, opts) }))
        r.fork.push(await time(async () => { forks = await sbx.fork({ count: 1 }) }))
        for (const s of [copy, ...forks, sbx]) await s.kill()
        await Sandbox.deleteSnapshot(snap.snapshotId, opts)
      }
    }
    console.log('persistence on gVisor, base, medians of 5 (networked / sealed)')
    for (const [op, what] of [['pause', 'pause() to disk'], ['resume', 'connect() (restore)'], ['snapshot', 'createSnapshot()'], ['create', 'create from the snapshot'], ['fork', 'fork({count: 1})']]) {
      const [a, b] = rows.map((r) => pct(r[op], 50))
      console.log(`  ${what.padEnd(26)} sealed ${ms(a).padStart(10)}  networked ${ms(b).padStart(10)}   ${(b / a).toFixed(2)}x`)
    }
  }
} finally {
  await server.stop()
  await sealed.stop()
  rmSync(dir, { recursive: true, force: true })
}
