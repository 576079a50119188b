// Reliability through the E2B SDK, each test on a server of its own:
// create/exec/kill cycles of every kind leave nothing behind on the host;
// a daemon killed with SIGKILL under load takes its sandboxes with it and
// the next one cleans up; a burst of creates larger than the pool is
// served or refused clearly, never hung or failed; a sandbox's noise does
// not break its neighbour. Bounded for CI; the full forms (500 cycles, a
// burst of 100) are `AIRLOCK_LEAK_CYCLES=500 AIRLOCK_BURST=100` or `make
// bench-reliability`. A failing cycle run replays with AIRLOCK_LEAK_SEED.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, RateLimitError } from 'e2b'
import { fmt, poolReady } from './bench-util.mjs'
import {
  backendName, serve as serveConfig, pools, trackBoxes, census, settle, quiesce, runCycles, leakReport, resources, alone,
  burst, overLimit, neighbour, crashUnderLoad,
} from './reliability-util.mjs'

const cycles = Number(process.env.AIRLOCK_LEAK_CYCLES ?? 40)
const burstSize = Number(process.env.AIRLOCK_BURST ?? 30)
// Networked cycles need the fake internet (tests/netlab), as every
// network the daemon gives must lead only there.
const labDNS = process.env.AIRLOCK_LAB_DNS
const rssBoundMiB = 64

// serve starts a server with config; done stops it, checking that it
// exits cleanly and leaves no sandbox.
async function serve(config) {
  const s = await serveConfig(config)
  return {
    ...s,
    async done(server) {
      const { code, leftover } = await s.done(server)
      assert.equal(code, 0, 'airlock serve exits 0 on SIGTERM')
      assert.deepEqual(leftover, [], 'no sandbox outlives the daemon')
    },
  }
}

test(`leak: ${cycles} create/exec/kill cycles of every kind leave no process, mount, cgroup, netns, file or fd`, { timeout: 600_000 }, async () => {
  const poolSize = 2
  const { server, done } = await serve({ templates: pools(poolSize), ...(labDNS && { network: { dns: [labDNS] } }) })
  try {
    await poolReady(server, 'base', poolSize)
    const boxes = await trackBoxes(server)
    try {
      // A warm-up of every kind: the daemon's first-use allocations
      // (connection pools, caches, the network's table) are not leaks.
      const warm = await runCycles({ n: 8, seed: 1, networked: !!labDNS })
      assert.deepEqual(warm.failures, [])
      await quiesce(server, poolSize)
      const before = await census(server, boxes, warm.sandboxIds)

      const seed = Number(process.env.AIRLOCK_LEAK_SEED ?? Math.floor(Math.random() * 1e9))
      const t = performance.now()
      const run = await runCycles({ n: cycles, seed, networked: !!labDNS, onProgress: (n) => console.log(`  ${n} cycles`) })
      const secs = (performance.now() - t) / 1000
      console.log(`leak (${backendName}): ${cycles} cycles in ${secs.toFixed(1)} s, seed ${seed}${labDNS ? '' : ', no networked cycles (no fake internet)'}: ${JSON.stringify(run.counts)}`)
      assert.deepEqual(run.failures, [], `cycles failed (AIRLOCK_LEAK_SEED=${seed} replays them)`)

      const { after, more } = await settle(server, boxes, before, poolSize, new Set([...warm.sandboxIds, ...run.sandboxIds]))
      console.log(leakReport(before, after, more))
      for (const r of resources) assert.deepEqual(more[r], [], `${r} left behind after ${cycles} cycles (AIRLOCK_LEAK_SEED=${seed})`)
      if (alone(before, after)) {
        assert.ok(after.totalMounts <= before.totalMounts, `host mounts ${before.totalMounts} → ${after.totalMounts}`)
        assert.ok(after.totalCgroups <= before.totalCgroups, `airlock cgroups ${before.totalCgroups} → ${after.totalCgroups}`)
      }
      const grew = (after.rssKiB - before.rssKiB) / 1024
      assert.ok(grew <= rssBoundMiB, `the daemon's RSS grew ${grew.toFixed(1)} MiB over ${cycles} cycles (bound ${rssBoundMiB} MiB)`)
    } finally {
      boxes.close()
    }
  } finally {
    await done(server)
  }
})

test('kill -9 under load: the sandboxes die with the daemon, the next start removes their cgroups and serves', { timeout: 300_000 }, async () => {
  const { server, restart, done } = await serve({ templates: pools(0) })
  let current = server
  try {
    const r = await crashUnderLoad(server, restart)
    current = r.server
    const ms = (x) => x === undefined ? 'not within 30 s' : `${(x / 1000).toFixed(2)} s`
    console.log(`crash (${backendName}): ${r.boxes} boxes, ${r.procsBefore} processes; from the kill: processes gone ${ms(r.procsGone)}, ` +
      `next server up ${ms(r.startedIn)}, cgroups removed ${ms(r.cgroupsGone)}, files and mounts ${ms(r.stateGone)}`)
    assert.deepEqual(r.leftProcs, [], "processes of the killed daemon's sandboxes")
    assert.deepEqual(r.leftCgroups, [], "cgroups of the killed daemon's sandboxes")
    assert.deepEqual(r.leftState, [], "files and mounts of the killed daemon's sandboxes")
    assert.ok(r.procsGone !== undefined && r.cgroupsGone !== undefined && r.stateGone !== undefined, 'all of it within 30 s')
    assert.deepEqual(await Sandbox.list().nextItems(), [], 'no sandbox of the killed daemon is listed')
    const s = await Sandbox.create()
    assert.equal((await s.commands.run('echo served')).stdout, 'served\n')
    assert.equal(await s.kill(), true)
  } finally {
    await done(current)
  }
})

test(`burst: ${burstSize} concurrent creates against a pool of 4 are served or refused with 429, never hung, never a 500`, { timeout: 300_000 }, async () => {
  // The limit is below the burst, so that both outcomes happen at once.
  const limit = burstSize - 5
  const { server, done } = await serve({ maxSandboxes: limit, templates: pools(4) })
  let b
  try {
    await poolReady(server, 'base', 4)
    b = await burst(burstSize)
    console.log(`burst (${backendName}): ${burstSize} creates, limit ${limit}: ${b.created.length} created, ${b.refused.length} refused, ${b.failed.length} failed; create ${fmt(b.latency)}`)
    assert.deepEqual(b.failed.map((r) => `${r.err?.name}: ${r.err?.message}`), [], 'creates that neither succeeded nor were refused with 429/503')
    assert.deepEqual(b.execFailures, [])
    assert.ok(b.created.length <= limit, `${b.created.length} created: never more than the limit, even all at once`)
    for (const r of b.refused) {
      assert.ok(r.err instanceof RateLimitError, `${r.err.name}: ${r.err.message}`)
      assert.match(r.err.message, /too many sandboxes: the limit is \d+/)
    }
    assert.equal(b.created.length, limit, 'exactly the limit is served: no refusal below it')
    // At the limit, one more is refused, as a plain client sees it.
    const over = await overLimit(server)
    assert.equal(over.status, 429, over.body)
    assert.match(over.body, /too many sandboxes/)
    assert.match(over.retryAfter ?? '', /^\d+$/, `a refusal carries a retry hint: Retry-After: ${over.retryAfter}`)
  } finally {
    if (b) assert.ok((await b.kill()).every(Boolean))
    await done(server)
  }
})

test('noisy neighbour: B\'s commands run while A burns CPU, fills its memory and disk, forks to its limit', { timeout: 300_000 }, async () => {
  const { server, done } = await serve({ templates: pools(2) })
  try {
    const rows = await neighbour({ samples: 20 })
    console.log(`noisy neighbour (${backendName}): B's commands.run('true'), median of 20`)
    for (const r of rows) console.log(`  ${r.noise.padEnd(11)} p50 ${r.p50.toFixed(2)} ms  ${r.ratio.toFixed(2)}x${r.aRunning === false ? '  (A had ended by itself)' : ''}`)
  } finally {
    await done(server)
  }
})
