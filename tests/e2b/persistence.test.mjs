// Pause to disk through the SDK: a sandbox with a running Jupyter context,
// a file and a background process is paused (its memory freed: no process
// of it is left), the daemon is killed with SIGKILL and started again, and
// connect brings everything back, three times in a row, with the timeout
// connect asks for. Where the backend pauses in memory (namespaces) the
// sandbox cannot outlive its daemon, and the test says so.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync, readdirSync, readFileSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox } from '@e2b/code-interpreter'
import { Sandbox as Base } from 'e2b'
import { startServer } from './harness.mjs'

const toDisk = process.env.AIRLOCK_TEST_BACKEND === 'gvisor'
const skip = !toDisk && 'the namespaces backend pauses in memory: a paused sandbox does not outlive its daemon there'

// The server's processes whose command line names its state directory:
// runsc and its sandboxes.
function processesOf(stateDir) {
  let n = 0
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes(stateDir + '/')) n++
    } catch {}
  }
  return n
}

let server
after(async () => {
  if (server) {
    const { code } = await server.stop()
    assert.equal(code, 0)
  }
})

test('pause to disk: variables, files and processes outlive a killed daemon, three times over', { skip, timeout: 300_000 }, async () => {
  const cfg = join(mkdtempSync(join(tmpdir(), 'airlock-persist-cfg-')), 'airlock.json')
  writeFileSync(cfg, JSON.stringify({ maxSandboxes: 1 }))
  const args = ['--config', cfg, '--pool-size', '0']
  server = await startServer(args)
  const sbx = await Sandbox.create('code-interpreter-v1')
  await sbx.runCode('x = 41')
  await sbx.files.write('/home/user/kept.txt', 'kept')
  await sbx.commands.run('sleep 100000', { background: true })
  assert.ok(processesOf(server.stateDir) > 0)

  assert.equal(await sbx.pause(), true)
  assert.equal(processesOf(server.stateDir), 0, 'a paused sandbox holds no memory: no process of it is left')
  assert.equal((await sbx.getInfo()).state, 'paused')
  // It counts against no limit (maxSandboxes is 1).
  const other = await Base.create()
  await other.kill()

  for (let round = 1; round <= 3; round++) {
    await server.crash()
    server = await startServer(args, { stateDir: server.stateDir, apiKey: server.apiKey })
    const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 90_000 })
    const x = await back.runCode('x += 1; x')
    assert.equal(x.text, String(41 + round), 'the kernel and its variables')
    assert.equal(await back.files.read('/home/user/kept.txt'), 'kept')
    const ps = await back.commands.run('ps -eo args')
    assert.match(ps.stdout, /sleep 100000/, 'the background process')
    const left = (new Date((await back.getInfo()).endAt) - Date.now()) / 1000
    assert.ok(left > 60 && left <= 90, `the timeout connect asked for, not a default: ${left} s left`)
    assert.equal(await back.pause(), true)
  }

  // A corrupt checkpoint is refused, clearly, and the sandbox can still
  // be killed; nothing else is lost.
  const bundles = join(server.stateDir, 'gvisor', 'bundles')
  const [bundle] = readdirSync(bundles).filter((b) => existsSync(join(bundles, b, 'checkpoint', 'checkpoint.img')))
  writeFileSync(join(bundles, bundle, 'checkpoint', 'checkpoint.img'), 'not a checkpoint')
  await assert.rejects(Sandbox.connect(sbx.sandboxId), /could not be restored from its saved state/)
  const fresh = await Base.create()
  assert.equal((await fresh.commands.run('echo fine')).stdout, 'fine\n')
  await fresh.kill()
  assert.equal(await Base.kill(sbx.sandboxId), true)
  assert.deepEqual(readdirSync(bundles), [], 'nothing of the killed sandbox is left')
})
