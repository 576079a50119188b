// What reliability.test.mjs and bench-reliability.mjs share: a census of
// what one airlock serve holds on the host (processes, mounts, cgroups,
// network namespaces, files, descriptors, memory), the create/exec/kill
// cycles that must leave none of it behind, a burst of creates, a crash
// under load, and a noisy neighbour. Everything is scoped to one server
// (its pid, its state directory, the ids of its boxes), so that another
// airlock on the machine changes no figure.
import { execFileSync } from 'node:child_process'
import { readdirSync, readFileSync, readlinkSync, realpathSync, existsSync, watch, mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, basename } from 'node:path'
import { Sandbox, CommandExitError, TimeoutError, RateLimitError, ServiceBusyError } from 'e2b'
import { startServer, sleep } from './harness.mjs'
import { metric, pct } from './bench-util.mjs'

export const backendName = process.env.AIRLOCK_TEST_BACKEND || 'namespaces'
export const gvisor = backendName === 'gvisor'
const cgroupRoot = '/sys/fs/cgroup'

// serve starts a server with config (JSON, in a file of its own);
// restart starts another on its state directory; done(s) stops s and
// removes the file, returning what stop() said.
export async function serve(config) {
  const dir = mkdtempSync(join(tmpdir(), 'airlock-reliability-'))
  const cfg = join(dir, 'airlock.json')
  writeFileSync(cfg, JSON.stringify(config))
  const args = ['--config', cfg]
  let server
  try {
    server = await startServer(args)
  } catch (e) {
    rmSync(dir, { recursive: true, force: true })
    throw e
  }
  const restart = () => startServer(args, { stateDir: server.stateDir, apiKey: server.apiKey })
  const done = async (s) => {
    try { return await s.stop() } finally { rmSync(dir, { recursive: true, force: true }) }
  }
  return { server, restart, done }
}

// pools: base's pool of n, none for the code interpreter (whose warm
// kernels would only take CPU from what is measured).
export const pools = (n) => ({ base: { poolSize: n }, 'code-interpreter-v1': { poolSize: 0 } })

export const read = (p) => { try { return readFileSync(p, 'latin1') } catch { return null } }
export const link = (p) => { try { return readlinkSync(p) } catch { return null } }
const pids = () => readdirSync('/proc').filter((p) => /^\d+$/.test(p)).map(Number)

// procTable: every process's parent, name and start time (the pair pid,
// start time names a process even after its pid is reused).
export function procTable() {
  const t = new Map()
  for (const pid of pids()) {
    const s = read(`/proc/${pid}/stat`)
    if (!s) continue
    const close = s.lastIndexOf(')')
    const f = s.slice(close + 2).split(' ')
    t.set(pid, { pid, comm: s.slice(s.indexOf('(') + 1, close), ppid: Number(f[1]), start: f[19] })
  }
  return t
}

export function descendants(root, table = procTable()) {
  const kids = new Map()
  for (const p of table.values()) (kids.get(p.ppid) ?? kids.set(p.ppid, []).get(p.ppid)).push(p)
  const out = []
  for (let q = [...(kids.get(root) ?? [])]; q.length;) {
    const p = q.pop()
    out.push(p)
    q.push(...(kids.get(p.pid) ?? []))
  }
  return out
}

// alive: p still runs (a zombie has let go of everything but its pid, and
// whoever reaps the orphans decides when that goes).
const alive = (p) => {
  const s = read(`/proc/${p.pid}/stat`)
  if (s === null) return false
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ')
  return f[19] === p.start && f[0] !== 'Z' && f[0] !== 'X'
}

// daemonPid: the airlock serve this test process started on stateDir
// (harness.mjs starts it as our child).
export function daemonPid(server) {
  if (server.pid) return server.pid
  for (const p of procTable().values()) {
    if (p.ppid !== process.pid) continue
    const argv = (read(`/proc/${p.pid}/cmdline`) ?? '').split('\0')
    if (argv.includes('serve') && argv.includes(server.stateDir)) return p.pid
  }
  throw new Error(`no airlock serve of ${server.stateDir} among this process's children`)
}

// The directory where each box of the backend holds its lock, named by
// the box's id, which is also its cgroup's name after "airlock-"
// (internal/backend/namespaces/state.go, internal/backend/gvisor).
const boxDir = (stateDir) => gvisor ? join(stateDir, 'gvisor', 'bundles') : join(stateDir, 'run', 'runs')

// trackBoxes records the id of every box the server makes from now on
// (and those it has): a leaked cgroup no longer has a lock file to say
// whose it was. Call close() when done.
export async function trackBoxes(server) {
  const dir = boxDir(server.stateDir)
  for (const end = Date.now() + 30_000; !existsSync(dir); await sleep(50)) {
    if (Date.now() > end) throw new Error(`${dir} did not appear`)
  }
  const ids = new Set()
  const add = (name) => { if (name && /^[0-9a-f]{16}$/.test(name)) ids.add(name) }
  const w = watch(dir, (_, name) => add(name))
  for (const name of readdirSync(dir)) add(name)
  return { ids, close: () => w.close() }
}

// Ids in paths and lines become placeholders, so that a refilled pool
// (other boxes, the same things) compares equal to the one before.
export const norm = (s) => s.replace(/\bi[0-9a-f]{19}\b/g, '<sandbox>').replace(/[0-9a-f]{16}/g, '<box>')
  .replace(/\b(socket|pipe|net|anon_inode):\[\d+\]/g, '$1').replace(/\[\d+\]/g, '[n]')

// The cgroups named airlock-*, in every hierarchy (v1 controllers, the v2
// or hybrid unified tree), each hierarchy once.
export function airlockCgroups() {
  const found = []
  const seen = new Set()
  const walk = (dir, depth) => {
    let entries
    try { entries = readdirSync(dir, { withFileTypes: true }) } catch { return }
    for (const e of entries) {
      if (!e.isDirectory()) continue
      const p = join(dir, e.name)
      if (e.name.startsWith('airlock-')) found.push(p)
      else if (depth < 4) walk(p, depth + 1)
    }
  }
  let tops
  try { tops = readdirSync(cgroupRoot) } catch { return found }
  for (const h of ['', ...tops]) {
    let real
    try { real = realpathSync(join(cgroupRoot, h)) } catch { continue }
    if (seen.has(real)) continue
    seen.add(real)
    if (h === '') {
      // v2 mounted at the root: its children are the cgroups.
      if (existsSync(join(cgroupRoot, 'cgroup.controllers'))) walk(real, 0)
      continue
    }
    if (existsSync(join(real, 'cgroup.procs'))) walk(real, 0)
  }
  return found
}

export const listenPort = (server) => Number(new URL(server.env.E2B_API_URL).port)

// The daemon's TCP sockets on its API port: clients' keep-alive
// connections (the SDK's, our metric reads), not the daemon's own state.
export function clientSockets(pid, port) {
  const inodes = new Set()
  for (const f of ['tcp', 'tcp6']) {
    for (const l of (read(`/proc/${pid}/net/${f}`) ?? '').split('\n').slice(1)) {
      const c = l.trim().split(/\s+/)
      if (c.length < 10) continue
      if (parseInt(c[1].split(':')[1], 16) === port && c[3] !== '0A') inodes.add(c[9])
    }
  }
  return inodes
}

function foreignAirlock(ours) {
  const mine = new Set(ours.map((p) => p.pid))
  const out = []
  for (const pid of pids()) {
    if (mine.has(pid) || pid === process.pid) continue
    const exe = basename(link(`/proc/${pid}/exe`) ?? '')
    if (/^(airlock|runsc)/.test(exe)) out.push(`${pid} ${exe}`)
  }
  return out
}

// What a server's state directory holds that is no sandbox's: caches a
// first use makes and keeps (gVisor's copy of /etc, warm snapshots), and
// the audit trails, which outlive their sandboxes by design (for
// audit.retention; internal/audit's tests cover their sweep).
// Each box of a pool holds its own files (namespaces: run/runs/<id> and
// run/agents/<id>.sock; gVisor: gvisor/bundles/<id>/…, gvisor/state/<id>/…,
// gvisor/agents/<id>/agent.sock): those compare equal at equal pool fill.
const kept = [/^gvisor\/etc\//, /^warm\//, /^audit\//]

function files(dir) {
  const out = []
  const walk = (d, rel) => {
    let entries
    try { entries = readdirSync(d, { withFileTypes: true }) } catch { return }
    for (const e of entries) {
      const r = rel ? `${rel}/${e.name}` : e.name
      if (kept.some((k) => k.test(r + (e.isDirectory() ? '/' : '')))) continue
      out.push(r)
      if (e.isDirectory()) walk(join(d, e.name), r)
    }
  }
  walk(dir, '')
  return out
}

// census counts what server holds on the host right now. boxes: the ids
// trackBoxes saw; sandboxIds: the SDK's ids, which mount lines may name.
export async function census(server, boxes, sandboxIds = new Set()) {
  const pid = daemonPid(server)
  const table = procTable()
  const desc = descendants(pid, table)
  const ownNet = link(`/proc/${pid}/ns/net`)
  const netns = new Set()
  for (const p of desc) {
    const n = link(`/proc/${p.pid}/ns/net`)
    if (n && n !== ownNet) netns.add(n)
  }
  const clients = clientSockets(pid, listenPort(server))
  const fds = []
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    const l = link(`/proc/${pid}/fd/${fd}`)
    if (!l) continue
    if (l.startsWith('socket:[') && clients.has(l.slice(8, -1))) continue
    if (l.startsWith('net:[') && l !== ownNet) netns.add(l)
    fds.push(norm(l))
  }
  const mountinfo = (read(`/proc/${pid}/mountinfo`) ?? '').split('\n').filter(Boolean)
  const names = [server.stateDir, ...boxes.ids, ...sandboxIds]
  const mounts = mountinfo.filter((l) => names.some((n) => l.includes(n)))
  for (const l of mounts) { const m = /net:\[\d+\]/.exec(l); if (m && m[0] !== ownNet) netns.add(m[0]) }
  const cgAll = airlockCgroups()
  const cgroups = cgAll.filter((p) => boxes.ids.has(basename(p).slice('airlock-'.length)))
  let ipNetns = []
  try { ipNetns = execFileSync('ip', ['netns', 'list'], { stdio: ['ignore', 'pipe', 'ignore'] }).toString().split('\n').filter(Boolean) } catch {}
  const rssKiB = Number(/VmRSS:\s+(\d+)/.exec(read(`/proc/${pid}/status`) ?? '')?.[1] ?? 0)
  return {
    processes: desc.map((p) => p.comm),
    mounts: mounts.map((l) => norm(l.split(' ').slice(3, 5).join(' '))),
    cgroups: cgroups.map((p) => norm(p)),
    netns: [...netns].map(() => 'net'),
    ipNetns,
    files: files(server.stateDir).map(norm),
    fds,
    rssKiB,
    // Host-wide figures, which another airlock (or a go test of one) on
    // the machine changes too: compared only where ours is alone.
    totalMounts: mountinfo.length,
    totalCgroups: cgAll.length,
    foreign: foreignAirlock([{ pid }, ...desc]),
    foreignCgroups: cgAll.filter((p) => !boxes.ids.has(basename(p).slice('airlock-'.length))).map((p) => basename(p)),
  }
}

export const resources = ['processes', 'mounts', 'cgroups', 'netns', 'ipNetns', 'files', 'fds']

// extra lists, per resource, what after holds beyond before (a multiset
// difference of the normalized entries); the totals where comparable.
export function extra(before, after) {
  const out = {}
  for (const r of resources) {
    const left = new Map()
    for (const x of before[r]) left.set(x, (left.get(x) ?? 0) + 1)
    const more = []
    for (const x of after[r]) {
      if (left.get(x) > 0) left.set(x, left.get(x) - 1)
      else more.push(x)
    }
    out[r] = more
  }
  return out
}

// alone says whether the host-wide totals are ours to compare: no other
// airlock or runsc process, and no airlock cgroup but ours, at either time.
export const alone = (before, after) => [before, after].every((c) => !c.foreign.length && !c.foreignCgroups.length)

// quiesce waits until the server runs no sandbox and its base pool holds
// poolSize ready ones.
export async function quiesce(server, poolSize, limitMs = 60_000) {
  for (const end = Date.now() + limitMs; ; await sleep(100)) {
    const running = await metric(server, 'airlock_sandboxes_running{template="base"}')
    const ready = await metric(server, 'airlock_pool_ready{template="base"}')
    if (running === 0 && ready >= poolSize) return
    if (Date.now() > end) throw new Error(`the server did not settle: ${running} running, pool ${ready}/${poolSize}`)
  }
}

// settle waits (at most limitMs) until the server holds no sandbox, its
// base pool is back to poolSize, and nothing is held beyond before; it
// returns the last census and what was still extra.
export async function settle(server, boxes, before, poolSize, sandboxIds, limitMs = 10_000) {
  await quiesce(server, poolSize)
  let after, more
  for (const end = Date.now() + limitMs; ; await sleep(200)) {
    after = await census(server, boxes, sandboxIds)
    more = extra(before, after)
    const totals = !alone(before, after) || (after.totalMounts <= before.totalMounts && after.totalCgroups <= before.totalCgroups)
    if (resources.every((r) => more[r].length === 0) && totals) break
    if (Date.now() > end) break
  }
  return { after, more }
}

// A small seeded generator: a failing run can be replayed with its seed.
export function rng(seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

function check(cond, msg) { if (!cond) throw new Error(msg) }
async function rejectsWith(p, cls, what) {
  try { await p } catch (e) {
    check(e instanceof cls, `${what}: got ${e?.name}: ${e?.message}, want ${cls.name}`)
    return e
  }
  throw new Error(`${what}: resolved, want ${cls.name}`)
}

async function gone(id, limitMs = 30_000) {
  for (const end = Date.now() + limitMs; Date.now() < end; await sleep(100)) {
    const list = await Sandbox.list().nextItems()
    if (!list.some((s) => s.sandboxId === id)) return
  }
  throw new Error(`sandbox ${id} outlived its time to live by ${limitMs / 1000} s`)
}

// The kinds of cycle, each create … kill with one way for a sandbox (or
// a command) to end. Each checks what the SDK saw.
function kinds(create, rand) {
  return {
    async plain() {
      const s = await create()
      const r = await s.commands.run('echo hi; echo err >&2')
      check(r.stdout === 'hi\n' && r.stderr === 'err\n', `plain: ${JSON.stringify(r)}`)
      check(await s.kill(), 'plain: kill')
    },
    async killedMidRun() {
      const s = await create()
      const h = await s.commands.run('echo started; sleep 1000', { background: true })
      await sleep(Math.floor(rand() * 100))
      check(await h.kill(), 'killedMidRun: the command was not found')
      await rejectsWith(h.wait(), CommandExitError, 'killedMidRun: wait')
      check(await s.kill(), 'killedMidRun: kill')
    },
    async commandTimeout() {
      const s = await create()
      await rejectsWith(s.commands.run('sleep 30', { timeoutMs: 50 + Math.floor(rand() * 150) }), TimeoutError, 'commandTimeout')
      check((await s.commands.run('echo after')).stdout === 'after\n', 'commandTimeout: the sandbox answers afterwards')
      check(await s.kill(), 'commandTimeout: kill')
    },
    async ttlExpires() {
      const s = await create({ timeoutMs: 1000 })
      await s.commands.run('sleep 1000', { background: true })
      await gone(s.sandboxId)
    },
    async backgroundLeft() {
      const s = await create()
      await s.commands.run('sleep 1000', { background: true })
      await s.commands.run('while :; do date > /tmp/t; done', { background: true })
      await s.commands.run('sh -c "sleep 1000 & sleep 1000 & wait"', { background: true })
      check(await s.kill(), 'backgroundLeft: kill')
    },
    async daemonized() {
      const s = await create()
      const r = await s.commands.run(`setsid sh -c 'trap "" TERM; sleep 1000' >/dev/null 2>&1 &`)
      check(r.exitCode === 0, 'daemonized: exit code')
      // The shell forks it in the background: on a loaded host it may
      // not have run sleep yet when the command returns.
      let runs = false
      for (let i = 0; i < 50 && !runs; i++) {
        runs = (await s.commands.run('ps -eo args')).stdout.includes('sleep 1000')
        if (!runs) await sleep(100)
      }
      check(runs, 'daemonized: the process runs')
      check(await s.kill(), 'daemonized: kill')
    },
    async concurrentKills() {
      const all = await Promise.all([0, 1, 2].map(() => create()))
      await Promise.all(all.map((s) => s.commands.run('sleep 1000', { background: true })))
      const killed = await Promise.all(all.map((s) => s.kill()))
      check(killed.every(Boolean), `concurrentKills: ${killed}`)
    },
    async networked() {
      const s = await create({ allowInternetAccess: true })
      const r = await s.commands.run('grep -c eth0 /proc/net/dev')
      check(r.stdout === '1\n', `networked: an interface: ${r.stdout}`)
      await s.commands.run('sleep 1000', { background: true })
      check(await s.kill(), 'networked: kill')
    },
  }
}

// runCycles drives n cycles, `parallel` at a time, of kinds picked by a
// generator seeded with seed; networked adds cycles with a network. It
// returns how many of each kind ran, the sandbox ids made, the failures.
export async function runCycles({ n, seed, parallel = 2, networked = false, onProgress }) {
  const rand = rng(seed)
  const sandboxIds = new Set()
  const create = async (opts = {}) => {
    const s = await Sandbox.create({ timeoutMs: 120_000, requestTimeoutMs: 60_000, ...opts })
    sandboxIds.add(s.sandboxId)
    return s
  }
  const k = kinds(create, rand)
  const names = Object.keys(k).filter((x) => networked || x !== 'networked')
  const plan = Array.from({ length: n }, () => names[Math.floor(rand() * names.length)])
  const counts = Object.fromEntries(names.map((x) => [x, 0]))
  const failures = []
  let next = 0, done = 0
  const worker = async () => {
    while (next < plan.length) {
      const kind = plan[next++]
      try {
        await k[kind]()
        counts[kind]++
      } catch (e) {
        failures.push(`${kind}: ${e?.stack ?? e}`)
      }
      if (++done % 50 === 0) onProgress?.(done)
    }
  }
  await Promise.all(Array.from({ length: parallel }, worker))
  return { counts, sandboxIds, failures }
}

// leakReport is one line per resource: before → after, and what is extra.
export function leakReport(before, after, more) {
  const lines = resources.map((r) => `  ${r.padEnd(10)} ${String(before[r].length).padStart(5)} → ${String(after[r].length).padEnd(5)} ${more[r].length ? 'EXTRA: ' + summarize(more[r]) : ''}`)
  lines.push(`  ${'rss'.padEnd(10)} ${(before.rssKiB / 1024).toFixed(1).padStart(5)} → ${(after.rssKiB / 1024).toFixed(1)} MiB (${((after.rssKiB - before.rssKiB) / 1024).toFixed(1)} MiB)`)
  const scope = alone(before, after) ? '' : ` (not compared: another airlock on this host: ${[...new Set([...after.foreign, ...after.foreignCgroups])].slice(0, 5).join(', ')})`
  lines.push(`  host-wide  mounts ${before.totalMounts} → ${after.totalMounts}, airlock cgroups ${before.totalCgroups} → ${after.totalCgroups}${scope}`)
  return lines.join('\n')
}

function summarize(xs) {
  const c = new Map()
  for (const x of xs) c.set(x, (c.get(x) ?? 0) + 1)
  return [...c].map(([x, n]) => `${n}× ${x}`).join('; ')
}

// burst starts n Sandbox.create() at once, each with its own deadline, and
// sorts the outcomes: created, refused with 429 or 503 (the SDK's
// RateLimitError, ServiceBusyError), or anything else (a failure: a 500,
// a hang past deadlineMs, a dropped connection).
export async function burst(n, deadlineMs = 150_000) {
  const one = async (i) => {
    const t = performance.now()
    let timer
    const deadline = new Promise((_, fail) => { timer = setTimeout(() => fail(new Error(`create ${i} hung for ${deadlineMs / 1000} s`)), deadlineMs) })
    try {
      const s = await Promise.race([Sandbox.create({ timeoutMs: 300_000, requestTimeoutMs: deadlineMs }), deadline])
      return { s, ms: performance.now() - t }
    } catch (e) {
      return { err: e, ms: performance.now() - t }
    } finally {
      clearTimeout(timer)
    }
  }
  const results = await Promise.all(Array.from({ length: n }, (_, i) => one(i)))
  const created = results.filter((r) => r.s)
  const refused = results.filter((r) => r.err instanceof RateLimitError || r.err instanceof ServiceBusyError)
  const failed = results.filter((r) => r.err && !refused.includes(r))
  // Each created sandbox runs one command; then all go.
  const execs = await Promise.all(created.map(async ({ s }, i) => {
    try { return (await s.commands.run(`echo ${i}`, { timeoutMs: 60_000 })).stdout === `${i}\n` ? null : `sandbox ${s.sandboxId}: wrong output` } catch (e) { return `sandbox ${s.sandboxId}: ${e.message}` }
  }))
  return {
    created,
    refused,
    failed,
    execFailures: execs.filter(Boolean),
    latency: created.map((r) => r.ms),
    kill: () => Promise.all(created.map(({ s }) => s.kill())),
  }
}

// overLimit asks for one more sandbox, as a plain client would, while the
// server is at its limit: status, Retry-After and message.
export async function overLimit(server) {
  const res = await fetch(server.env.E2B_API_URL + '/sandboxes', {
    method: 'POST',
    headers: { 'X-API-KEY': server.apiKey, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: 'base', timeout: 30 }),
  })
  const body = await res.text()
  if (res.ok) {
    const { sandboxID } = JSON.parse(body)
    await Sandbox.kill(sandboxID)
  }
  return { status: res.status, retryAfter: res.headers.get('retry-after'), body }
}

// The neighbour's noises, each bounded by its own sandbox's limits.
export const noises = {
  // Every core the sandbox sees (its CPU limit is one).
  'cpu burn': 'for i in $(seq $(nproc)); do (while :; do :; done) & done; wait',
  // Up to the memory limit, again and again (each try ends in the OOM
  // killer or MemoryError).
  'memory hog': `while :; do python3 -c '
a = []
while True: a.append(b"x" * (32 << 20))'; done`,
  // /tmp until it is full, again and again.
  'disk fill': 'while :; do dd if=/dev/zero of=/tmp/fill bs=1M 2>/dev/null; rm -f /tmp/fill; done',
  // Until the pids limit holds it.
  'fork bomb': 'f() { f | f & }; f; sleep 1000',
}

// sampleExec is `samples` latencies of commands.run('true') in sbx; every
// one must succeed.
export async function sampleExec(sbx, samples) {
  const out = []
  for (let i = 0; i < samples; i++) {
    const t = performance.now()
    const r = await sbx.commands.run('true', { timeoutMs: 60_000 })
    out.push(performance.now() - t)
    check(r.exitCode === 0, `exec ${i}: exit code ${r.exitCode}`)
  }
  return out
}

// neighbour measures B's exec latency alone, then beside A making each
// noise in turn (A killed after each). It returns rows {noise, p50, ratio, aState}.
export async function neighbour({ samples = 20, settleMs = 1000 } = {}) {
  const b = await Sandbox.create({ timeoutMs: 300_000 })
  try {
    await sampleExec(b, 3) // warm
    const alone = pct(await sampleExec(b, samples), 50)
    const rows = [{ noise: 'alone', p50: alone, ratio: 1 }]
    for (const [noise, cmd] of Object.entries(noises)) {
      const a = await Sandbox.create({ timeoutMs: 300_000 })
      await a.commands.run(cmd, { background: true, timeoutMs: 0 })
      await sleep(settleMs)
      let xs
      try {
        xs = await sampleExec(b, samples)
      } catch (e) {
        throw new Error(`B's exec failed beside A's ${noise}: ${e.message}`)
      }
      const aRunning = await a.isRunning().catch(() => false)
      await a.kill()
      rows.push({ noise, p50: pct(xs, 50), ratio: pct(xs, 50) / alone, aRunning })
    }
    return rows
  } finally {
    await b.kill()
  }
}

// crashUnderLoad loads server (sandboxes with running commands, one of
// them a SIGTERM-ignoring daemon, a foreground command, a create on its
// way), kills the daemon with SIGKILL and starts another on the same
// state directory. It returns the new server and how long (from the kill)
// until every process of the old daemon's sandboxes was gone, their
// cgroups removed, and their files and mounts.
export async function crashUnderLoad(server, start, { sandboxes = 3, limitMs = 30_000 } = {}) {
  const pending = []
  for (let i = 0; i < sandboxes; i++) {
    const s = await Sandbox.create({ timeoutMs: 300_000 })
    await s.commands.run('sleep 1000', { background: true })
    await s.commands.run(`setsid sh -c 'trap "" TERM; sleep 1000' >/dev/null 2>&1 &`)
    pending.push(s.commands.run('sleep 1000', { timeoutMs: 0 }).catch(() => {}))
  }
  // A create in flight: the kill comes once its box exists.
  const boxes = await trackBoxes(server)
  const had = new Set(boxes.ids)
  pending.push(Sandbox.create({ timeoutMs: 300_000, requestTimeoutMs: 30_000 }).catch(() => {}))
  for (const end = Date.now() + 30_000; [...boxes.ids].every((id) => had.has(id)); await sleep(2)) {
    if (Date.now() > end) throw new Error('the in-flight create made no box')
  }
  const pid = daemonPid(server)
  const procs = descendants(pid)
  const ids = [...boxes.ids]
  const t0 = performance.now()
  await server.crash()
  boxes.close()
  // Processes the kill caught half-made are in the boxes' cgroups.
  const inCgroups = () => airlockCgroups().filter((p) => ids.includes(basename(p).slice('airlock-'.length)))
  // Their locks, sockets, bundles, runsc state and mounts (on the host).
  const inState = () => [...files(server.stateDir), ...(read('/proc/self/mountinfo') ?? '').split('\n')]
    .filter((l) => ids.some((id) => l.includes(id)))
  const since = () => performance.now() - t0
  let startedIn
  // The next server starts at once, as a supervisor would start it.
  const restarted = start().then((s) => { startedIn = since(); return s })
  let procsGone, cgroupsGone, stateGone
  for (const end = t0 + limitMs; performance.now() < end; await sleep(20)) {
    const cgs = inCgroups()
    const tasks = cgs.flatMap((p) => (read(join(p, 'cgroup.procs')) ?? '').split('\n').filter(Boolean))
    if (procsGone === undefined && !procs.some(alive) && tasks.length === 0) procsGone = since()
    if (cgroupsGone === undefined && cgs.length === 0) cgroupsGone = since()
    if (stateGone === undefined && inState().length === 0) stateGone = since()
    if (procsGone !== undefined && cgroupsGone !== undefined && stateGone !== undefined) break
  }
  const next = await restarted
  await Promise.all(pending)
  return {
    server: next,
    procsBefore: procs.length,
    boxes: ids.length,
    startedIn,
    procsGone,
    cgroupsGone,
    stateGone,
    leftProcs: procs.filter(alive).map((p) => `${p.pid} ${p.comm}`),
    leftCgroups: inCgroups(),
    leftState: inState(),
  }
}
