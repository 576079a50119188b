// Reliability in full (`make bench-reliability` runs it on each backend,
// in the fake internet): a burst of 100 creates against a pool of 4,
// 500 create/exec/kill cycles with what each resource held before and
// after, the recovery from kill -9 under load, and a sandbox's exec
// latency beside noisy neighbours, as ratios. Sizes: AIRLOCK_BURST,
// AIRLOCK_LEAK_CYCLES, AIRLOCK_CRASH_ROUNDS, AIRLOCK_NOISY_SAMPLES.
// tests/e2b/reliability.test.mjs is the bounded form that CI asserts.
import { pct, poolReady } from './bench-util.mjs'
import {
  backendName, serve, pools, trackBoxes, census, settle, quiesce, runCycles, resources, alone,
  burst, neighbour, crashUnderLoad,
} from './reliability-util.mjs'

const env = (k, d) => Number(process.env[k] ?? d)
const burstSize = env('AIRLOCK_BURST', 100)
const cycles = env('AIRLOCK_LEAK_CYCLES', 500)
const crashRounds = env('AIRLOCK_CRASH_ROUNDS', 3)
const samples = env('AIRLOCK_NOISY_SAMPLES', 50)
const labDNS = process.env.AIRLOCK_LAB_DNS
let bad = false
const fail = (msg) => { bad = true; console.log(`  FAIL: ${msg}`) }
const count = (xs) => { const m = new Map(); for (const x of xs) m.set(x, (m.get(x) ?? 0) + 1); return m }
const row = (...cols) => console.log('  ' + cols.map((c, i) => String(c).padEnd(i ? 12 : 16)).join(''))

console.log(`reliability, ${backendName} backend${labDNS ? '' : ' (no fake internet: no networked cycles; run under tests/netlab)'}`)

// Burst: within the server's limit, so every create should succeed.
{
  const { server, done } = await serve({ maxSandboxes: Math.max(100, burstSize), templates: pools(4) })
  try {
    await poolReady(server, 'base', 4)
    const t = performance.now()
    const b = await burst(burstSize)
    const secs = (performance.now() - t) / 1000
    console.log(`\nburst: ${burstSize} concurrent Sandbox.create() against a pool of 4 (${secs.toFixed(1)} s)`)
    row('created', 'refused', 'failed', 'success', 'p50 ms', 'p99 ms')
    const lat = b.latency.length ? b.latency : [NaN]
    row(b.created.length, b.refused.length, b.failed.length, `${(100 * b.created.length / burstSize).toFixed(1)} %`, pct(lat, 50).toFixed(0), pct(lat, 99).toFixed(0))
    for (const [msg, n] of count(b.refused.map((r) => `${r.err.name}: ${r.err.message}`))) console.log(`  refused ${n}×: ${msg}`)
    for (const r of b.failed.slice(0, 5)) fail(`${r.err?.name}: ${r.err?.message}`)
    for (const e of b.execFailures.slice(0, 5)) fail(e)
    await b.kill()
  } finally {
    await done(server)
  }
}

// Leak: every kind of cycle, then what the server holds against before.
{
  const poolSize = 2
  const { server, done } = await serve({ templates: pools(poolSize), ...(labDNS && { network: { dns: [labDNS] } }) })
  try {
    await poolReady(server, 'base', poolSize)
    const boxes = await trackBoxes(server)
    const warm = await runCycles({ n: 8, seed: 1, networked: !!labDNS })
    for (const f of warm.failures) fail(f)
    await quiesce(server, poolSize)
    const before = await census(server, boxes, warm.sandboxIds)
    const seed = env('AIRLOCK_LEAK_SEED', Math.floor(Math.random() * 1e9))
    const t = performance.now()
    const run = await runCycles({ n: cycles, seed, networked: !!labDNS, onProgress: (n) => process.stderr.write(`  ${n}/${cycles} cycles\r`) })
    const secs = (performance.now() - t) / 1000
    const { after, more } = await settle(server, boxes, before, poolSize, new Set([...warm.sandboxIds, ...run.sandboxIds]))
    boxes.close()
    console.log(`\nleak: ${cycles} cycles in ${secs.toFixed(1)} s (${(cycles / secs).toFixed(1)}/s), seed ${seed}`)
    console.log(`  ${Object.entries(run.counts).map(([k, n]) => `${k} ${n}`).join(', ')}`)
    row('resource', 'before', 'after', 'extra')
    for (const r of resources) row(r, before[r].length, after[r].length, more[r].length)
    row('rss MiB', (before.rssKiB / 1024).toFixed(1), (after.rssKiB / 1024).toFixed(1), ((after.rssKiB - before.rssKiB) / 1024).toFixed(1))
    row('host mounts', before.totalMounts, after.totalMounts, alone(before, after) ? after.totalMounts - before.totalMounts : 'n/a')
    row('host cgroups', before.totalCgroups, after.totalCgroups, alone(before, after) ? after.totalCgroups - before.totalCgroups : 'n/a')
    for (const f of run.failures.slice(0, 5)) fail(f)
    for (const r of resources) if (more[r].length) fail(`${r} left behind: ${[...new Set(more[r])].slice(0, 5).join('; ')}`)
  } finally {
    await done(server)
  }
}

// Crash: kill -9 under load, the next start on the same state directory.
{
  const { server, restart, done } = await serve({ templates: pools(0) })
  let current = server
  const rounds = []
  try {
    for (let i = 0; i < crashRounds; i++) {
      const r = await crashUnderLoad(current, restart)
      current = r.server
      rounds.push(r)
      if (r.leftProcs.length || r.leftCgroups.length || r.leftState.length) fail(`round ${i + 1} left ${JSON.stringify([r.leftProcs, r.leftCgroups, r.leftState])}`)
    }
  } finally {
    await done(current)
  }
  const s = (x) => x === undefined ? '>30' : (x / 1000).toFixed(2)
  console.log(`\ncrash: kill -9 with ${rounds[0]?.boxes} boxes (sandboxes with commands running, one create in flight), seconds from the kill`)
  row('round', 'processes', 'next up', 'cgroups', 'files+mounts')
  for (const [i, r] of rounds.entries()) row(i + 1, `${s(r.procsGone)} (${r.procsBefore})`, s(r.startedIn), s(r.cgroupsGone), s(r.stateGone))
}

// Noisy neighbour: B's exec latency alone and beside each noise of A.
{
  const { server, done } = await serve({ templates: pools(2) })
  try {
    const rows = await neighbour({ samples })
    console.log(`\nnoisy neighbour: B's commands.run('true'), median of ${samples}`)
    row('A does', 'p50 ms', 'ratio')
    for (const r of rows) row(r.noise, r.p50.toFixed(2), `${r.ratio.toFixed(2)}x${r.aRunning === false ? ' (A ended by itself)' : ''}`)
  } catch (e) {
    fail(e.message)
  } finally {
    await done(server)
  }
}

if (bad) process.exitCode = 1
