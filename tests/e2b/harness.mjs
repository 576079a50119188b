// Starts a real `airlock serve` for the tests and points the SDK at it.
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, readdirSync, existsSync, appendFileSync, writeFileSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { createInterface } from 'node:readline'

const bin = process.env.AIRLOCK_BIN ?? resolve(import.meta.dirname, '../../bin/airlock')

// A test file cut off by its timeout gets SIGTERM: the servers it started
// end with it (and their sandboxes with them) rather than outlive the run.
const live = new Set()
process.once('SIGTERM', () => {
  for (const p of live) p.kill('SIGTERM')
  process.exit(143)
})

// opts.stateDir and opts.apiKey start a server where an earlier one left
// off (see crash); opts.config is its config file's content, written for
// the start (the server reads it then) and removed after it, started or
// not; opts.env adds to the server's environment.
export async function startServer(extraArgs = [], opts = {}) {
  let cfgDir
  if (opts.config) {
    cfgDir = mkdtempSync(join(tmpdir(), 'airlock-e2b-cfg-'))
    writeFileSync(join(cfgDir, 'airlock.json'), JSON.stringify(opts.config))
    extraArgs = ['--config', join(cfgDir, 'airlock.json'), ...extraArgs]
  }
  const stateDir = opts.stateDir ?? mkdtempSync(join(tmpdir(), 'airlock-e2b-test-'))
  const apiKey = opts.apiKey ?? 'e2b_' + randomBytes(20).toString('hex')
  // AIRLOCK_TEST_BACKEND=gvisor runs the same suites on the gVisor backend.
  const backend = process.env.AIRLOCK_TEST_BACKEND ? ['--backend', process.env.AIRLOCK_TEST_BACKEND] : []
  // opts.bin: another build of airlock (a new binary on the same state).
  const proc = spawn(opts.bin ?? bin, ['serve', '--listen', '127.0.0.1:0', '--state-dir', stateDir, ...backend, ...extraArgs], {
    env: { ...process.env, AIRLOCK_API_KEY: apiKey, ...opts.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  live.add(proc)
  proc.on('exit', () => live.delete(proc))
  let log = ''
  proc.stderr.on('data', (d) => { log += d; if (process.env.AIRLOCK_TEST_LOG) appendFileSync(process.env.AIRLOCK_TEST_LOG, d) })
  const env = { E2B_API_KEY: apiKey }
  const lines = createInterface({ input: proc.stdout })
  await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error('airlock serve did not start:\n' + log)), 15000)
    proc.on('exit', (code) => fail(new Error(`airlock serve exited with ${code}:\n${log}`)))
    lines.on('line', (line) => {
      // A comment: where the key is (it is printed only to a terminal).
      if (line.startsWith('#')) return
      const [k, ...v] = line.split('=')
      env[k] = v.join('=')
      if (k === 'E2B_SANDBOX_URL') { clearTimeout(timer); ok() }
    })
  }).catch((err) => {
    // A server that did not start leaves nothing for stop() to clean.
    proc.kill('SIGTERM')
    rmSync(stateDir, { recursive: true, force: true })
    throw err
  }).finally(() => {
    if (cfgDir) rmSync(cfgDir, { recursive: true, force: true })
  })
  Object.assign(process.env, env)
  return {
    env,
    apiKey,
    stateDir,
    pid: proc.pid,
    log: () => log,
    // crash kills the server with SIGKILL and leaves its state directory
    // for the next one.
    async crash() {
      const exited = new Promise((ok) => proc.on('exit', ok))
      proc.kill('SIGKILL')
      await exited
    },
    // term stops the server with SIGTERM and leaves its state directory
    // for the next one; it returns the exit code.
    async term() {
      const exited = new Promise((ok) => proc.on('exit', ok))
      proc.kill('SIGTERM')
      return await exited
    },
    async stop() {
      // What the server logged as errors goes with the test's output: a
      // failure in CI is then more than a status code.
      const errors = log.split('\n').filter((l) => /level=ERROR/.test(l))
      if (errors.length) console.error('airlock serve logged errors:\n' + errors.slice(-20).join('\n'))
      const exited = new Promise((ok) => proc.on('exit', (code, sig) => ok({ code, sig })))
      proc.kill('SIGTERM')
      const res = await exited
      const runs = join(stateDir, 'run', 'runs')
      const left = existsSync(runs) ? readdirSync(runs) : []
      rmSync(stateDir, { recursive: true, force: true })
      return { ...res, leftover: left }
    },
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// Hosts differ, even of one kind: a test that relies on a host feature
// probes it first and says why it skips.
const cgroupV2 = existsSync('/sys/fs/cgroup/cgroup.controllers')

// Pausing needs cgroup v2 or a v1 freezer hierarchy.
export const canPause = cgroupV2 || existsSync('/sys/fs/cgroup/freezer/cgroup.procs')
export const noFreezer = !canPause && 'this host has no freezer cgroup: sandboxes cannot be paused here'

// A sandbox's CPU time so far needs cgroup v2 or a v1 cpuacct hierarchy.
export const countsCPU = cgroupV2 || existsSync('/sys/fs/cgroup/cpuacct/cgroup.procs')
