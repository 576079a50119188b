// Benchmark of templates made from images, through the official E2B SDK
// on the namespaces backend. Prints medians and ratios to baselines
// measured in the same run; asserts nothing.
//   build:   Template.build of a busybox image with a RUN, a COPY and an
//            ENV step (cache skipped), against creating a base sandbox,
//            running the same command in it and killing it.
//   create:  Sandbox.create of the template, warm (its pool: the template
//            has a start command) and cold (a second server without
//            pools), against base the same ways.
//   memory:  what 50 idle sandboxes of each take from the host
//            (MemAvailable before and after).
import { spawn } from 'node:child_process'
import { mkdtempSync, writeFileSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { Sandbox, Template, waitForFile } from 'e2b'
import { pct, time, poolReady } from './bench-util.mjs'
import { startServer, sleep } from './harness.mjs'

const N = Number(process.env.N ?? 15)
const med = (xs) => pct(xs, 50)
const reg = spawn(resolve(import.meta.dirname, '../../bin/mkimage'), [], { stdio: ['pipe', 'pipe', 'inherit'] })
const registry = await new Promise((ok) => createInterface({ input: reg.stdout }).on('line', (l) => { if (l.startsWith('REGISTRY=')) ok(l.slice(9)) }))
const ctx = mkdtempSync(join(tmpdir(), 'airlock-bench-tpl-'))
writeFileSync(join(ctx, 'app.sh'), 'echo app\n')

const dir = mkdtempSync(join(tmpdir(), 'airlock-bench-'))
const cfgWarm = join(dir, 'warm.json')
writeFileSync(cfgWarm, JSON.stringify({ poolMemoryBudget: '8G', templates: { base: { poolSize: 1 }, 'code-interpreter-v1': { poolSize: 0 } }, templatePoolSize: 1, builds: { network: 'none', registryAddresses: ['127.0.0.1'] } }))
let server = await startServer(['--config', cfgWarm])

const steps = 'mkdir -p /opt/app && echo built > /opt/app/stamp'
const tpl = () => Template({ fileContextPath: ctx })
  .fromImage(`${registry}/busybox:latest`)
  .setEnvs({ STAGE: 'bench' })
  .runCmd(steps, { user: 'root' })
  .copy('app.sh', '/opt/app/')
  .setStartCmd('echo up > /tmp/up && exec sleep 1000000', waitForFile('/tmp/up'))
await Template.build(tpl(), 'bench-tpl') // the image pulled once
const builds = []
const builtIn = []
for (let i = 0; i < N; i++) {
  builds.push(await time(() => Template.build(tpl(), 'bench-tpl', { skipCache: true })))
  builtIn.push(await time(async () => {
    const s = await Sandbox.create()
    await s.commands.run(steps.replaceAll('/opt', '/tmp'))
    await s.kill()
  }))
}

// The server's own time for each build, from its log: what the build
// cost without the SDK's polling.
const serverBuilds = [...server.log().matchAll(/template built.*cached=false s=([\d.]+)/g)].slice(1).map((m) => Number(m[1]) * 1000)

async function creates(template, warm) {
  const xs = []
  for (let i = 0; i < N; i++) {
    if (warm) await poolReady(server, template, 1)
    let s
    xs.push(await time(async () => { s = await Sandbox.create(template) }))
    await s.kill()
  }
  return xs
}
await Sandbox.create('bench-tpl').then((s) => s.kill()) // makes its pool
const warmTpl = await creates('bench-tpl', true)
const warmBase = await creates('base', true)

async function memory(template, n = 50) {
  const avail = () => Number(/MemAvailable:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))[1]) * 1024
  await sleep(1000)
  const before = avail()
  const sbxs = []
  for (let i = 0; i < n; i++) sbxs.push(await Sandbox.create(template, { timeoutMs: 600_000 }))
  await sleep(2000)
  const used = before - avail()
  await Promise.all(sbxs.map((s) => s.kill()))
  return used / n
}
const memTpl = await memory('bench-tpl')
const memBase = await memory('base')
await server.stop()

const cfgCold = join(dir, 'cold.json')
writeFileSync(cfgCold, JSON.stringify({ templates: { base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 } }, templatePoolSize: 0, builds: { network: 'none', registryAddresses: ['127.0.0.1'] } }))
server = await startServer(['--config', cfgCold])
await Template.build(tpl(), 'bench-tpl')
const coldTpl = await creates('bench-tpl', false)
const coldBase = await creates('base', false)
await server.stop()
reg.stdin.end()

const ms = (x) => `${x.toFixed(1)} ms`
const mb = (x) => `${(x / 1048576).toFixed(1)} MB`
console.log(`templates (${process.env.AIRLOCK_TEST_BACKEND ?? 'namespaces'} backend, medians of ${N}):`)
console.log(`  build (image cached, 4 steps + start/ready): through the SDK ${ms(med(builds))}, in the server ${ms(med(serverBuilds))}; base create + the RUN + kill ${ms(med(builtIn))}: ${(med(serverBuilds) / med(builtIn)).toFixed(2)}×`)
console.log(`  create warm: template ${ms(med(warmTpl))}, base ${ms(med(warmBase))}: ${(med(warmTpl) / med(warmBase)).toFixed(2)}×`)
console.log(`  create cold: template (start cmd ready-checked) ${ms(med(coldTpl))}, base ${ms(med(coldBase))}: ${(med(coldTpl) / med(coldBase)).toFixed(2)}×`)
console.log(`  memory per idle sandbox (50 of each): template ${mb(memTpl)}, base ${mb(memBase)}: ${(memTpl / memBase).toFixed(2)}×`)
