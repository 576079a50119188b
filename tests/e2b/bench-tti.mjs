// Time to interactive as the public ComputeSDK scoreboard measures it,
// through the E2B SDK (`make bench-tti`, in the fake internet): a create,
// then `node -v` in the sandbox, timed together; the destroy untimed.
// Sequential (one at a time, each from the pool if it has one) and a
// burst of 100 at once, p50/p95/p99, against `node -v` run bare on the
// host in the same run. The server is the one the README starts: its
// defaults (the Debian root, a pool of `base`, networks). Asserts nothing.
import { execFileSync } from 'node:child_process'
import { Sandbox } from 'e2b'
import { startServer } from './harness.mjs'
import { pct, time, poolReady } from './bench-util.mjs'

const backend = process.env.AIRLOCK_TEST_BACKEND ?? 'namespaces'
const N = Number(process.env.N ?? 50)
const BURST = Number(process.env.BURST ?? 100)
const row = (what, xs, base) => `  ${what.padEnd(34)} p50 ${pct(xs, 50).toFixed(1).padStart(7)} ms  p95 ${pct(xs, 95).toFixed(1).padStart(7)} ms  p99 ${pct(xs, 99).toFixed(1).padStart(7)} ms` +
  (base ? `   ${(pct(xs, 50) / base).toFixed(1)}x bare` : '')

// One sample: create, node -v, destroy (untimed). A refusal (429, 503)
// is counted, not timed.
async function sample() {
  let sbx
  const t = await time(async () => {
    sbx = await Sandbox.create({ timeoutMs: 300_000 })
    const r = await sbx.commands.run('node -v')
    if (!r.stdout.startsWith('v')) throw new Error(`node -v: ${r.stdout} ${r.stderr}`)
  }).catch((e) => ({ error: e }))
  if (sbx) sbx.kill().catch(() => {})
  return t
}

const bare = []
for (let i = 0; i < 20; i++) bare.push(await time(async () => { execFileSync('node', ['-v']) }))
const server = await startServer([])
try {
  const seq = []
  for (let i = 0; i < N; i++) {
    await poolReady(server, 'base', 1, 120_000)
    const t = await sample()
    if (typeof t === 'number') seq.push(t)
  }
  await poolReady(server, 'base', 1, 120_000)
  const results = await Promise.all(Array.from({ length: BURST }, () => sample()))
  const burst = results.filter((t) => typeof t === 'number')
  const refused = results.filter((t) => typeof t !== 'number')
  console.log(`time to interactive (create, then node -v), ${backend} backend, ${new Date().toISOString().slice(0, 10)}`)
  console.log(row('node -v on the host (baseline)', bare))
  console.log(row(`sequential (n=${seq.length})`, seq, pct(bare, 50)))
  console.log(row(`${BURST} at once (${burst.length} served)`, burst, pct(bare, 50)))
  if (refused.length) console.log(`  refused in the burst: ${refused.length} (${[...new Set(refused.map((r) => String(r.error).split('\n')[0].slice(0, 80)))].join('; ')})`)
} finally {
  await server.stop()
}
