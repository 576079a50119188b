// The stock templates on the Debian root against the jail (the host's
// /usr), through the official E2B SDKs, in one run (`make bench-stock`).
// Prints medians and tails; asserts nothing.
//   claim:   Sandbox.create() from a full pool, one at a time: jail, and
//            base on the Debian root, on one server;
//   memory:  what an idle sandbox's cgroup holds (getMetrics' memUsed),
//            10 of each, code-interpreter-v1 with its first cell run, on
//            each root;
//   cell:    create + first runCode('1+1') from the pool, and a first
//            JavaScript cell, code-interpreter-v1 on the Debian root
//            against code-interpreter-v1 on the jail (a second server).
// Needs the stock root made (make stock).
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox } from '@e2b/code-interpreter'
import { pct, time, poolReady } from './bench-util.mjs'
import { startServer, sleep } from './harness.mjs'

const N = Number(process.env.N ?? 40)
const backend = process.env.AIRLOCK_TEST_BACKEND ?? 'namespaces'
const MiB = 1 << 20
const dir = mkdtempSync(join(tmpdir(), 'airlock-bench-stock-'))
const ms = (xs) => `p50 ${pct(xs, 50).toFixed(1)} ms, p99 ${pct(xs, 99).toFixed(1)} ms`

async function serve(name, cfg) {
  const file = join(dir, name + '.json')
  writeFileSync(file, JSON.stringify({ poolMemoryBudget: '8G', metricsInterval: '1s', ...cfg }))
  return startServer(['--config', file])
}

console.log(`stock templates, the Debian root against the jail, ${backend} backend, ${new Date().toISOString().slice(0, 10)}`)
const out = []
let server = await serve('debian', {
  templates: { base: { poolSize: 4 }, jail: { poolSize: 4 }, 'code-interpreter-v1': { poolSize: 2 } },
})
try {
  for (const t of ['jail', 'base']) {
    const xs = []
    for (let i = 0; i < N; i++) {
      await poolReady(server, t, 4, 120_000)
      let sbx
      xs.push(await time(async () => { sbx = await Sandbox.create(t) }))
      await sbx.kill()
    }
    out.push(`claim from the pool, ${t === 'base' ? 'base (Debian root)' : 'jail'}: ${ms(xs)}`)
  }
  out.push(await memory('jail', 'jail'))
  out.push(await memory('base', 'Debian root'))
  out.push(await memory('code-interpreter-v1', 'Debian root', server))
  out.push(...await cells('Debian root', server))
} finally {
  await server.stop()
}
server = await serve('jail', { stock: { root: 'jail' }, templates: { base: { poolSize: 0 }, jail: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 2 } } })
try {
  out.push(await memory('code-interpreter-v1', 'jail', server))
  out.push(...await cells('jail', server))
} finally {
  await server.stop()
}
rmSync(dir, { recursive: true, force: true })
console.log(out.map((l) => '  ' + l).join('\n'))

// memory is what 10 idle sandboxes of template t hold, each (a code
// interpreter's with its first cell run, each claimed from server's full
// pool once its kernels run), by their cgroups.
async function memory(t, root, server) {
  const boxes = []
  for (let i = 0; i < 10; i++) {
    if (server) await settledPool(server)
    const s = await Sandbox.create(t, { timeoutMs: 600_000 })
    if (t === 'code-interpreter-v1') await s.runCode('1')
    boxes.push(s)
  }
  await sleep(3000)
  const mem = []
  for (const s of boxes) mem.push((await s.getMetrics())[0].memUsed / MiB)
  await Promise.all(boxes.map((s) => s.kill()))
  return `memory of an idle ${t} on the ${root}: p50 ${pct(mem, 50).toFixed(1)} MiB`
}

// settledPool waits for server's code-interpreter-v1 pool to be full and
// its kernels to run: a pooled sandbox counts as ready before them, and
// on the Debian root they take ~5 s more on 2 cores (Python's, then
// Node's, which the pool starts).
async function settledPool(server) {
  await poolReady(server, 'code-interpreter-v1', 2, 180_000)
  await sleep(8000)
}

// cells times code-interpreter-v1's first cells, from a full pool.
async function cells(root, server) {
  const py = []
  const js = []
  for (let i = 0; i < Math.min(N, 15); i++) {
    await settledPool(server)
    let sbx
    py.push(await time(async () => { sbx = await Sandbox.create(); await sbx.runCode('1+1') }))
    js.push(await time(() => sbx.runCode('1+1', { language: 'js' })))
    await sbx.kill()
  }
  return [`code-interpreter-v1 on the ${root}: create + first Python cell ${ms(py)}; then a first JavaScript cell ${ms(js)}`]
}
