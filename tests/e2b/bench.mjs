// Benchmark of airlock serve through the official E2B SDK. Prints medians
// and 99th percentiles; asserts nothing. The baseline, measured in the same
// run, is a bare HTTP round trip to the daemon (the floor of any call).
import { Sandbox } from 'e2b'
import { pct, fmt, time, poolReady } from './bench-util.mjs'
import { startServer, sleep } from './harness.mjs'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'

async function baseline(server, n = 200) {
  const xs = []
  for (let i = 0; i < n; i++) xs.push(await time(() => fetch(server.env.E2B_API_URL + '/health').then((r) => r.text())))
  return xs
}

// A pool of 20 needs more than the default 1 GiB budget on gVisor, whose
// idle sandboxes hold more memory (the Sentry's). Only base sandboxes are
// measured: twenty code interpreters starting their kernels alongside
// would load the two cores for minutes.
const cfg = join(mkdtempSync(join(tmpdir(), 'airlock-bench-')), 'airlock.json')
// (--pool-size would set every template's pool: the sizes go in the config.)
writeFileSync(cfg, JSON.stringify({ poolMemoryBudget: '8G', templates: { base: { poolSize: 20 }, 'code-interpreter-v1': { poolSize: 0 } } }))
const warm = await startServer(['--config', cfg])
const floor = await baseline(warm)
await poolReady(warm, 'base', 20)

const single = []
for (let i = 0; i < 40; i++) {
  await poolReady(warm, 'base', 1)
  let sbx
  single.push(await time(async () => { sbx = await Sandbox.create() }))
  await sbx.kill()
}

const burst = []
for (let round = 0; round < 3; round++) {
  await poolReady(warm, 'base', 20)
  const sbxs = await Promise.all(Array.from({ length: 20 }, async () => {
    let sbx
    burst.push(await time(async () => { sbx = await Sandbox.create() }))
    return sbx
  }))
  await Promise.all(sbxs.map((s) => s.kill()))
}

// Round trips in a quiet daemon: the pool refilled, the claim's refill done.
await poolReady(warm, 'base', 20)
const sbx = await Sandbox.create()
await poolReady(warm, 'base', 20)
for (let i = 0; i < 5; i++) await sbx.commands.run('true')
const runs = []
for (let i = 0; i < 100; i++) runs.push(await time(() => sbx.commands.run('true')))
const files = []
for (let i = 0; i < 100; i++) files.push(await time(() => sbx.files.read('/etc/hostname')))
await sbx.kill()
await warm.stop()
rmSync(dirname(cfg), { recursive: true })

const cold = await startServer(['--pool-size', '0'])
const coldTimes = []
for (let i = 0; i < 20; i++) {
  let s
  coldTimes.push(await time(async () => { s = await Sandbox.create() }))
  await s.kill()
}
await cold.stop()

const med = (xs) => pct(xs, 50)
console.log(`airlock serve${process.env.AIRLOCK_TEST_BACKEND ? ' --backend ' + process.env.AIRLOCK_TEST_BACKEND : ''} through the E2B SDK (e2b ${(await import('e2b/package.json', { with: { type: 'json' } })).default.version})`)
console.log(`  baseline: HTTP GET /health            ${fmt(floor)}`)
console.log(`  create, from the pool, 1 at a time     ${fmt(single)}   ${(med(single) / med(floor)).toFixed(1)}x baseline`)
console.log(`  create, from the pool, 20 concurrent   ${fmt(burst)}`)
console.log(`  create, cold (no pool)                 ${fmt(coldTimes)}`)
console.log(`  commands.run('true') round trip        ${fmt(runs)}   ${(med(runs) / med(floor)).toFixed(1)}x baseline`)
console.log(`  files.read of a small file             ${fmt(files)}`)
