// Density and bursts on one host, as an operator plans capacity (`make
// bench-density` runs it on each backend). Prints figures and ratios;
// asserts nothing.
//   memory:  what an idle sandbox of base and of code-interpreter-v1 (its
//            kernel started) takes, from the sandboxes' own cgroups and
//            from the host (MemAvailable before and after), 20 of each;
//   density: idle base sandboxes added 50 at a time, without a network
//            and with one, until the host's available memory would fall
//            below 2 GiB, its tasks would pass 80 % of what the kernel
//            allows (kernel.pid_max, threads-max; AIRLOCK_DENSITY_PID_MAX
//            raises pid_max for the run), the server refuses (503: a full
//            host), a create and one command take more than a second, or
//            AIRLOCK_DENSITY_MAX (6000) is reached, with the daemon's
//            /health and a create + command timed at each step;
//   refill:  a pool of 32 filled from empty: sandboxes per second, per core;
//   burst:   100 concurrent Sandbox.create() beyond a pool of 4, each then
//            running a command: p50, p99 and how many succeeded.
import { readFileSync, readdirSync, existsSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs'
import { cpus, tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'
import { pct, time, poolReady } from './bench-util.mjs'
import { startServer, sleep } from './harness.mjs'
import { burst } from './reliability-util.mjs'

const backend = process.env.AIRLOCK_TEST_BACKEND ?? 'namespaces'
const max = Number(process.env.AIRLOCK_DENSITY_MAX ?? 6000)
const floor = 2 * 2 ** 30 // bytes of MemAvailable the density run leaves the host (not 2 << 30: 32-bit in JavaScript)
const MiB = 1 << 20
const tasks = () => Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[3].split('/')[1])
const taskLimit = () => Math.min(...['/proc/sys/kernel/pid_max', '/proc/sys/kernel/threads-max'].map((f) => Number(readFileSync(f, 'utf8'))))
const avail = () => Number(/MemAvailable:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'))[1]) * 1024
const mib = (b) => `${(b / MiB).toFixed(1)} MiB`

// cgroupMemory sums what every sandbox's cgroup holds now (cgroup v1 or v2).
function cgroupMemory() {
  const [root, file] = existsSync('/sys/fs/cgroup/cgroup.controllers')
    ? ['/sys/fs/cgroup', 'memory.current'] : ['/sys/fs/cgroup/memory', 'memory.usage_in_bytes']
  let sum = 0
  let n = 0
  for (const d of readdirSync(root)) {
    if (!d.startsWith('airlock-')) continue
    try { sum += Number(readFileSync(join(root, d, file), 'utf8')); n++ } catch {}
  }
  return { sum, n }
}

const dir = mkdtempSync(join(tmpdir(), 'airlock-bench-density-'))
async function serve(templates, extra = {}) {
  const cfg = join(dir, `config-${Math.random().toString(16).slice(2)}.json`)
  writeFileSync(cfg, JSON.stringify({ maxSandboxes: 10000, poolMemoryBudget: '64G', ...extra, templates }))
  return startServer(['--config', cfg])
}

console.log(`density and bursts, ${backend} backend, ${cpus().length} cores, ${mib(avail())} available`)

// Memory per idle sandbox. The code interpreter's pool is kept (of one)
// so that gVisor's creates are clones of its warm snapshot, as an
// operator's would be; what it holds is counted before.
{
  const server = await serve({ base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 1 } })
  try {
    await poolReady(server, 'code-interpreter-v1', 1, 180_000)
    const rows = []
    for (const [template, create] of [
      ['base', async () => Sandbox.create({ timeoutMs: 600_000 })],
      ['code-interpreter-v1', async () => { const s = await CodeSandbox.create({ timeoutMs: 600_000 }); await s.runCode('1'); return s }],
    ]) {
      await sleep(1000)
      const before = { host: avail(), cg: cgroupMemory() }
      const boxes = []
      for (let i = 0; i < 20; i++) boxes.push(await create())
      await sleep(3000)
      const after = { host: avail(), cg: cgroupMemory() }
      rows.push([template, (after.cg.sum - before.cg.sum) / boxes.length, (before.host - after.host) / boxes.length])
      await Promise.all(boxes.map((s) => s.kill()))
    }
    console.log('\nmemory per idle sandbox (20 of each)')
    for (const [t, cg, host] of rows) console.log(`  ${t.padEnd(22)} its cgroup ${mib(cg).padStart(10)}   the host ${mib(host).padStart(10)}`)
  } finally {
    await server.stop()
  }
}

// Density: idle base sandboxes, 50 more at a time, sealed (no network)
// and then with the server's default network.
async function density(label, extra) {
  const server = await serve({ base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 } }, extra)
  const boxes = []
  let why = `${max} sandboxes (AIRLOCK_DENSITY_MAX)`
  try {
    console.log(`\ndensity, ${label}: idle base sandboxes, 50 at a time; then a /health and a create + commands.run('true') timed`)
    console.log('  sandboxes   available    /health p50   create+run')
    const start = { mem: avail(), tasks: tasks() }
    let per = 0
    let perTasks = 0
    while (boxes.length < max) {
      if (per && avail() - 50 * per < floor) { why = `the host's available memory (${mib(avail())}) would fall below ${mib(floor)}`; break }
      if (perTasks && tasks() + 50 * perTasks > 0.8 * taskLimit()) { why = `the host's ${tasks()} tasks would pass 80 % of the kernel's ${taskLimit()}`; break }
      const before = avail()
      const beforeTasks = tasks()
      const made = await Promise.allSettled(Array.from({ length: Math.min(50, max - boxes.length) }, () => Sandbox.create({ timeoutMs: 3_600_000 })))
      boxes.push(...made.filter((r) => r.status === 'fulfilled').map((r) => r.value))
      const refused = made.find((r) => r.status === 'rejected')
      if (refused) { why = `the server refused: ${String(refused.reason).split('\n')[0].slice(0, 160)}`; break }
      await sleep(500)
      per = Math.max(per, (before - avail()) / 50)
      perTasks = Math.max(perTasks, (tasks() - beforeTasks) / 50)
      const health = []
      for (let i = 0; i < 5; i++) health.push(await time(() => fetch(process.env.E2B_API_URL + '/health')))
      let one
      const createRun = await time(async () => { one = await Sandbox.create(); await one.commands.run('true') })
      await one.kill()
      console.log(`  ${String(boxes.length).padStart(9)}   ${mib(avail()).padStart(11)}   ${pct(health, 50).toFixed(1).padStart(8)} ms   ${createRun.toFixed(0).padStart(7)} ms`)
      if (createRun > 1000) { why = 'a create and one command took more than a second'; break }
    }
    const n = boxes.length
    console.log(`  stopped at ${n} idle sandboxes: ${why}; each takes ${mib((start.mem - avail()) / n)} and ${((tasks() - start.tasks) / n).toFixed(1)} tasks of the host`)
  } finally {
    for (let i = 0; i < boxes.length; i += 100) await Promise.all(boxes.slice(i, i + 100).map((s) => s.kill().catch(() => {})))
    await server.stop()
  }
}

// The kernel's task limit is raised for the density runs when
// AIRLOCK_DENSITY_PID_MAX says so (make bench-density: 4194304, what
// systemd sets on most distributions), and put back after.
const pidMaxFile = '/proc/sys/kernel/pid_max'
const pidMax = readFileSync(pidMaxFile, 'utf8').trim()
const wantPidMax = process.env.AIRLOCK_DENSITY_PID_MAX
try {
  if (wantPidMax && Number(wantPidMax) > Number(pidMax)) {
    writeFileSync(pidMaxFile, wantPidMax)
    console.log(`\nkernel.pid_max raised from ${pidMax} to ${wantPidMax} for the density runs`)
  }
  await density('without a network', { network: { default: 'none' } })
  await density('with the default network')
} finally {
  if (readFileSync(pidMaxFile, 'utf8').trim() !== pidMax) writeFileSync(pidMaxFile, pidMax)
}

// Refill: a pool of 32 filled from empty, as after a burst took it.
{
  const t = performance.now()
  const server = await serve({ base: { poolSize: 32 }, 'code-interpreter-v1': { poolSize: 0 } })
  try {
    await poolReady(server, 'base', 32, 300_000)
    const secs = (performance.now() - t) / 1000
    console.log(`\nrefill: a pool of 32 base sandboxes filled in ${secs.toFixed(2)} s from the server's start: ${(32 / secs).toFixed(1)} sandboxes/s, ${(32 / secs / cpus().length).toFixed(1)} per second per core`)
  } finally {
    await server.stop()
  }
}

// Burst: 100 concurrent creates beyond a pool of 4.
{
  const server = await serve({ base: { poolSize: 4 }, 'code-interpreter-v1': { poolSize: 0 } })
  try {
    await poolReady(server, 'base', 4)
    const t = performance.now()
    const b = await burst(100)
    const secs = (performance.now() - t) / 1000
    console.log(`\nburst: 100 concurrent Sandbox.create() beyond a pool of 4: ${b.created.length} created, ${b.refused.length} refused, ${b.failed.length} failed; ` +
      `create p50 ${pct(b.latency, 50).toFixed(0)} ms, p99 ${pct(b.latency, 99).toFixed(0)} ms; all created and each ran a command in ${secs.toFixed(1)} s`)
    await b.kill()
  } finally {
    await server.stop()
  }
}
rmSync(dir, { recursive: true, force: true })
