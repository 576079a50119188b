// Persistence on gVisor, through the SDK, medians of 5 rounds each:
// - pause and resume, saved to disk (runsc checkpoint/restore) against
//   frozen in memory (a server with pauseInMemory), for sandboxes holding
//   64 MiB to 1 GiB of their own;
// - fork of a code interpreter sandbox (1, 3 and 10 copies) and a snapshot of
//   it, against creating one and running its first cell;
// - create-to-first-cell of the code interpreter: a kernel started in the
//   sandbox (no warm snapshot) against a clone of the warm snapshot, from
//   the pool and cold (a pool memory budget that keeps the pool empty).
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox as Base } from 'e2b'
import { Sandbox } from '@e2b/code-interpreter'
import { startServer, sleep } from './harness.mjs'
import { metric, pct, poolReady, time } from './bench-util.mjs'

process.env.AIRLOCK_TEST_BACKEND = 'gvisor'
const dir = mkdtempSync(join(tmpdir(), 'airlock-bench-pause-'))
// Every server is sealed (network.default "none"): the figures are the
// sandbox's own; what a network adds to each (its network made anew),
// bench-net measures.
const config = (c) => {
  const file = join(dir, `${Object.keys(c).join('-') || 'default'}.json`)
  writeFileSync(file, JSON.stringify({ network: { default: 'none' }, ...c }))
  return ['--config', file]
}
const rounds = 5
const median = async (f) => {
  const xs = []
  for (let i = 0; i < rounds; i++) xs.push(await f())
  return pct(xs, 50)
}

// withServer runs f against a server started with args, and stops it
// even if f fails.
async function withServer(args, f) {
  const server = await startServer(args)
  try {
    return await f(server)
  } finally {
    await server.stop()
  }
}

const sizes = [64, 256, 512, 1024]
const paused = {}
const big = { templates: { base: { memory: '2G' } } }
for (const [mode, c] of [['disk', big], ['memory', { ...big, pauseInMemory: true }]]) {
  await withServer([...config(c), '--pool-size', '0'], async () => {
    for (const mib of sizes) {
      const pause = [], resume = []
      const sbx = await Base.create('base', { timeoutMs: 600_000 })
      // Memory of its own, touched: a process that holds it while paused.
      await sbx.commands.run(`python3 -c "import time; b = bytearray(${mib} << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; open('/tmp/ready', 'w'); time.sleep(100000)"`, { background: true })
      while ((await sbx.commands.run('test -e /tmp/ready && echo y || true')).stdout.trim() !== 'y') await sleep(100)
      for (let i = 0; i < rounds; i++) {
        pause.push(await time(() => sbx.pause()))
        resume.push(await time(() => Base.connect(sbx.sandboxId, { timeoutMs: 600_000 })))
      }
      await sbx.kill()
      paused[`${mode} ${mib}`] = { pause: pct(pause, 50), resume: pct(resume, 50) }
    }
  })
}

// The time from create to the first cell's result.
const firstCell = async () => time(async () => {
  const s = await Sandbox.create('code-interpreter-v1')
  const r = await s.runCode('1 + 1')
  if (r.text !== '2') throw new Error(`first cell: ${r.text} ${r.error?.value}`)
  await s.kill()
})

const cells = {}, forks = {}
await withServer([...config({}), '--pool-size', '0'], async () => {
  cells.fresh = await median(firstCell)
  const src = await Sandbox.create('code-interpreter-v1', { timeoutMs: 600_000 })
  await src.runCode('x = 1')
  for (const count of [1, 3, 10]) {
    forks[count] = await median(async () => {
      let copies
      const ms = await time(async () => { copies = await src.fork({ count }) })
      for (const c of copies) await c.kill()
      return ms
    })
  }
  let n = 0
  forks.snapshot = await median(async () => {
    const name = `bench-snap-${n++}`
    const ms = await time(() => src.createSnapshot({ name }))
    await Sandbox.deleteSnapshot(`${name}:default`)
    return ms
  })
  await src.kill()
})
await withServer([...config({}), '--pool-size', '1'], async (server) => {
  cells.pooled = await median(async () => {
    await poolReady(server, 'code-interpreter-v1', 1, 240_000)
    return firstCell()
  })
})
await withServer([...config({ poolMemoryBudget: '1K' }), '--pool-size', '1'], async (server) => {
  for (const end = Date.now() + 240_000; await metric(server, 'airlock_warm_snapshots_made_total') < 1; await sleep(100)) {
    if (Date.now() > end) throw new Error('no warm snapshot was made')
  }
  cells.cold = await median(firstCell)
})

console.log(`gVisor persistence, medians of ${rounds} (ms)\n\npause/resume: to disk vs in memory`)
for (const mib of sizes) {
  const d = paused[`disk ${mib}`], m = paused[`memory ${mib}`]
  console.log(`${String(mib).padStart(5)} MiB  pause ${d.pause.toFixed(0).padStart(5)} vs ${m.pause.toFixed(0).padStart(4)} (${(d.pause / m.pause).toFixed(0)}x)   resume ${d.resume.toFixed(0).padStart(5)} vs ${m.resume.toFixed(0).padStart(4)} (${(d.resume / m.resume).toFixed(0)}x)`)
}
const vs = (ms) => `${ms.toFixed(0).padStart(6)}  (${(ms / cells.fresh).toFixed(2)}x)`
console.log(`\ncode interpreter, against create + first cell with a kernel started in the sandbox (${cells.fresh.toFixed(0)})`)
console.log(`create + first cell, warm snapshot clone from the pool ${vs(cells.pooled)}`)
console.log(`create + first cell, warm snapshot clone, cold         ${vs(cells.cold)}`)
console.log(`fork x1                                                ${vs(forks[1])}`)
console.log(`fork x3                                                ${vs(forks[3])}`)
console.log(`fork x10                                               ${vs(forks[10])}`)
console.log(`snapshot                                               ${vs(forks.snapshot)}`)
rmSync(dir, { recursive: true, force: true }) // the servers' config files
