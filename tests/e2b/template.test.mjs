// The SDK's Template builder against airlock serve: an image pulled from a
// registry on loopback (tests/mkimage), built with the SDK's steps, and
// sandboxes of the result.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { Sandbox, Template, BuildError, waitForFile } from 'e2b'
import { startServer } from './harness.mjs'

const skip = false

let server, registry, regProc, context
before(async () => {
  if (skip) return
  server = await startServer()
  regProc = spawn(resolve(import.meta.dirname, '../../bin/mkimage'), [], { stdio: ['pipe', 'pipe', 'inherit'] })
  registry = await new Promise((ok, fail) => {
    regProc.on('exit', (code) => fail(new Error(`mkimage exited with ${code}`)))
    createInterface({ input: regProc.stdout }).on('line', (l) => { if (l.startsWith('REGISTRY=')) ok(l.slice(9)) })
  })
  // The build context of COPY steps.
  context = mkdtempSync(join(tmpdir(), 'airlock-template-'))
  mkdirSync(join(context, 'app/lib'), { recursive: true })
  writeFileSync(join(context, 'app/main.sh'), 'echo "main from the context"\n')
  writeFileSync(join(context, 'app/lib/util.txt'), 'util\n')
  writeFileSync(join(context, 'notes.txt'), 'a note\n')
})
after(async () => {
  if (skip) return
  regProc.stdin.end()
  rmSync(context, { recursive: true, force: true })
  const { code, leftover } = await server.stop()
  assert.equal(code, 0)
  assert.deepEqual(leftover, [], 'no sandbox, build sandboxes included, outlives the daemon')
})

const run = async (sbx, cmd, opts) => (await sbx.commands.run(cmd, opts)).stdout.trim()

test('Template builder: fromImage, envs, runCmd, copy, workdir, user, start and ready commands', { skip }, async () => {
  const logs = []
  const t = Template({ fileContextPath: context })
    .fromImage(`${registry}/busybox:latest`)
    .setEnvs({ STAGE: 'built', GREETING: 'hello there' })
    .runCmd('echo "root writes /opt" && mkdir -p /opt/tool && echo "$STAGE" > /opt/tool/stage', { user: 'root' })
    .copy('app', '/opt/app/')
    .copy('notes.txt', '/opt/notes/readme.txt', { mode: 0o600 })
    .runCmd('rm /bin/dd', { user: 'root' }) // a file of the image's layer, removed
    .setWorkdir('/srv/work')
    .setUser('user')
    .runCmd('whoami > who && pwd >> who && echo "$GREETING"')
    .setStartCmd('echo started > /tmp/started && exec sleep 100000', waitForFile('/tmp/started'))
  const info = await Template.build(t, 'bbtest', { tags: ['v1', 'default'], onBuildLogs: (e) => logs.push(e.message), cpuCount: 1, memoryMB: 256 })
  assert.equal(info.templateId, 'bbtest')
  assert.ok(logs.some((l) => l === 'hello there'), 'a step\'s output is in the build log:\n' + logs.join('\n'))
  assert.ok(logs.some((l) => /ready: \[ -f/.test(l)), 'the start command was ready-checked')

  assert.equal(await Template.exists('bbtest'), true)
  assert.equal(await Template.exists('bbtest:v1'), true)
  assert.equal(await Template.exists('base'), true, 'the server\'s own templates exist too')
  assert.equal(await Template.exists('no-such-template'), false)

  const sbx = await Sandbox.create('bbtest')
  try {
    assert.equal(await run(sbx, 'cat /opt/tool/stage'), 'built')
    assert.equal(await run(sbx, 'cat /opt/app/main.sh'), 'echo "main from the context"')
    assert.equal(await run(sbx, 'cat /opt/app/lib/util.txt'), 'util')
    assert.equal(await run(sbx, 'stat -c "%a %U" /opt/notes/readme.txt'), '600 user', 'copied as the build\'s user, with its mode')
    assert.equal(await run(sbx, 'test -e /bin/dd || echo gone'), 'gone', 'the removal is a whiteout in the new layer')
    assert.equal(await run(sbx, 'cat /srv/work/who'), 'user\n/srv/work')
    assert.equal(await run(sbx, 'echo "$STAGE $FROM_IMAGE"'), 'built busybox', 'the envs of the image and of the build')
    assert.equal(await run(sbx, 'cat /tmp/started'), 'started', 'the start command ran in this sandbox')
    // The whole root is writable, by root; the user's own files by the user.
    assert.equal(await run(sbx, 'id -u && echo x > /etc/written && cat /etc/written', { user: 'root' }), '0\nx')
    await assert.rejects(sbx.commands.run('echo x > /etc/by-user'), (err) => /Permission denied/.test(err.stderr))
  } finally {
    await sbx.kill()
  }
  const next = await Sandbox.create('bbtest:v1')
  try {
    assert.equal(await run(next, 'test -e /etc/written || echo fresh'), 'fresh', 'a write in one sandbox is not in the next')
    const info = await next.getInfo()
    assert.equal(info.cpuCount, 1, 'the template\'s cpuCount')
    assert.equal(info.memoryMB, 256, 'the template\'s memoryMB')
  } finally {
    await next.kill()
  }

  // Tags: assign, list, remove.
  await Template.assignTags('bbtest:v1', ['stable'])
  const tags = (await Template.getTags('bbtest')).map((x) => x.tag).sort()
  assert.deepEqual(tags, ['default', 'stable', 'v1'])
  await Template.removeTags('bbtest', ['stable'])
  assert.equal(await Template.exists('bbtest:stable'), false)

  // The same base and steps again: the build is reused, unless skipCache.
  const again = []
  await Template.build(t, 'bbtest-copy', { onBuildLogs: (e) => again.push(e.message) })
  assert.ok(again.some((l) => /reusing/.test(l)), again.join('\n'))
})

test('Template builder: fromTemplate, buildInBackground, a failing step and bad input', { skip }, async () => {
  const base = Template().fromImage(`${registry}/busybox:latest`).runCmd('echo one > /srv/one', { user: 'root' })
  await Template.build(base, 'bb-base')
  const child = Template().fromTemplate('bb-base').runCmd('cat /srv/one > /srv/two', { user: 'root' })
  const bg = await Template.buildInBackground(child, 'bb-child')
  let status
  for (let i = 0; i < 600; i++) {
    status = await Template.getBuildStatus(bg)
    if (status.status !== 'building' && status.status !== 'waiting') break
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.equal(status.status, 'ready', JSON.stringify(status))
  const sbx = await Sandbox.create('bb-child')
  try {
    assert.equal(await run(sbx, 'cat /srv/one /srv/two'), 'one\none')
  } finally {
    await sbx.kill()
  }

  // A step that fails fails the build, naming the step.
  const bad = Template().fromTemplate('bb-base').runCmd('echo about to fail && exit 3')
  await assert.rejects(Template.build(bad, 'bb-bad'), (err) => err instanceof BuildError && /exited with code 3/.test(err.message))
  assert.equal(await Template.exists('bb-bad'), false, 'a failed build makes no template')
  // What cannot be built is refused at once.
  await assert.rejects(Template.build(Template().fromTemplate('nope').runCmd('true'), 'bb-x'), /not a template made from an image/)
  await assert.rejects(Template.build(Template().fromTemplate('bb-base').setUser('nobody'), 'bb-x'), /users root and user/)
  await assert.rejects(Template.build(base, 'Bad Name!'), /template name/)
})
