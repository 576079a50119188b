// Live restore: how long a daemon takes to start when it takes back 100
// sandboxes an earlier one left running (kill -9), against the same
// start with none to take back, in the same process; medians of 5
// rounds each (`make bench-live` runs it on each backend).
// - start: from spawning `airlock serve` to its printing its URLs, which
//   it does once every sandbox is taken back;
// - adopt: the daemon's own figure for taking them back (its log's
//   "live sandboxes taken back … ms=");
// - all answer: from the spawn until every sandbox answered a command.
import { Sandbox } from 'e2b'
import { startServer } from './harness.mjs'
import { pct } from './bench-util.mjs'

const backend = process.env.AIRLOCK_TEST_BACKEND || 'namespaces'
const n = Number(process.env.AIRLOCK_LIVE_SANDBOXES ?? 100)
const rounds = 5
const config = { liveRestore: true, templates: { base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 }, jail: { poolSize: 0 } } }

let server = await startServer([], { config })
const { stateDir, apiKey } = server
// restart kills the server and starts another on its state directory:
// the time to its URLs, and the adoption time it logged.
async function restart() {
  await server.crash()
  const t = performance.now()
  server = await startServer([], { config, stateDir, apiKey })
  const start = performance.now() - t
  // Its log (stderr) may trail its URLs (stdout) a little.
  let m
  for (let i = 0; i < 40 && !(m = /live sandboxes taken back" count=(\d+) ms=(\d+)/.exec(server.log())); i++) await new Promise((r) => setTimeout(r, 50))
  return { start, t, taken: m ? Number(m[1]) : 0, adopt: m ? Number(m[2]) : 0 }
}

const ids = []
try {
  const empty = []
  for (let r = 0; r < rounds; r++) empty.push((await restart()).start)
  for (let i = 0; i < n; i += 10) {
    const batch = await Promise.all(Array.from({ length: Math.min(10, n - i) }, () => Sandbox.create({ timeoutMs: 3_600_000 })))
    ids.push(...batch.map((s) => s.sandboxId))
  }
  const start = [], adopt = [], answer = []
  for (let r = 0; r < rounds; r++) {
    const got = await restart()
    if (got.taken !== n) throw new Error(`${got.taken} of ${n} sandboxes taken back:\n${server.log()}`)
    start.push(got.start)
    adopt.push(got.adopt)
    await Promise.all(ids.map(async (id) => {
      const sbx = await Sandbox.connect(id)
      await sbx.commands.run('true')
    }))
    answer.push(performance.now() - got.t)
  }
  const p50 = (xs) => pct(xs, 50)
  console.log(`live restore, ${n} sandboxes (${backend}, medians of ${rounds}, ${new Date().toISOString().slice(0, 10)}):`)
  console.log(`  start with none to take back  ${p50(empty).toFixed(0)} ms`)
  console.log(`  start taking back ${n}         ${p50(start).toFixed(0)} ms  (${(p50(start) / p50(empty)).toFixed(1)}x; +${((p50(start) - p50(empty)) / n).toFixed(1)} ms a sandbox)`)
  console.log(`  of it, taking them back       ${p50(adopt).toFixed(0)} ms  (${(p50(adopt) / n).toFixed(1)} ms a sandbox)`)
  console.log(`  until all ${n} answered        ${p50(answer).toFixed(0)} ms`)
} finally {
  for (const id of ids) await Sandbox.kill(id).catch(() => {})
  await server.stop()
}
