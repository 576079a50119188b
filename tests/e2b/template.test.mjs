// The SDK's Template builder against airlock serve: an image pulled from a
// registry on loopback (tests/mkimage), built with the SDK's steps, and
// sandboxes of the result.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, rmSync, statSync, chmodSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { Sandbox, Template, BuildError, waitForFile } from 'e2b'
import { startServer } from './harness.mjs'

const skip = false

let server, registry, regProc, context
before(async () => {
  if (skip) return
  // The registry is on loopback: a server pulls clients' images from
  // the internet only, unless its operator lists a registry's address.
  server = await startServer([], { config: { builds: { registryAddresses: ['127.0.0.1'] } } })
  // With a Debian root (make test makes one: tests/fixtures/debian-root.sh)
  // the registry serves it too, as debian:latest.
  const root = process.env.AIRLOCK_DEBIAN_ROOT ? ['-root', process.env.AIRLOCK_DEBIAN_ROOT] : []
  regProc = spawn(resolve(import.meta.dirname, '../../bin/mkimage'), root, { stdio: ['pipe', 'pipe', 'inherit'] })
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
    // Files and a terminal as root too.
    await sbx.files.write('/etc/by-root.conf', 'rooted', { user: 'root' })
    assert.equal(await run(sbx, 'stat -c %U /etc/by-root.conf && cat /etc/by-root.conf'), 'root\nrooted')
    await assert.rejects(sbx.files.write('/etc/by-user.conf', 'x'), /ermission/)
    await sbx.files.write('/home/user/mine.txt', 'mine', { metadata: { kept: 'in the writable layer' } })
    assert.deepEqual((await sbx.files.getInfo('/home/user/mine.txt')).metadata, { kept: 'in the writable layer' })
    assert.equal(await run(sbx, 'stat -c %U:%G /home/user/mine.txt /etc/by-root.conf'), 'user:user\nroot:root', 'files are made as who asked')
    let out = ''
    const dec = new TextDecoder()
    const pty = await sbx.pty.create({ cols: 80, rows: 24, user: 'root', onData: (d) => { out += dec.decode(d) } })
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('echo UID=$(id -u); exit\n'))
    await pty.wait()
    assert.match(out, /UID=0/)

    // sudo, as E2B's templates give it: passwordless, the agent running the
    // command as root with sudo's own stdio, exit status and environment.
    assert.equal(await run(sbx, 'sudo id -u'), '0')
    assert.equal(await run(sbx, 'sudo -u user id -u'), '1000')
    assert.equal(await run(sbx, 'sudo -n sh -c \'echo $USER $HOME $SUDO_USER\''), 'root /root user', 'env_reset as sudo does')
    assert.equal(await run(sbx, 'MINE=x sudo -E sh -c \'echo $MINE\'; MINE=x sudo sh -c \'echo "[$MINE]"\''), 'x\n[]', '-E keeps the caller\'s environment')
    assert.equal(await run(sbx, 'echo piped | sudo cat'), 'piped', 'stdin is the caller\'s')
    assert.equal(await run(sbx, 'sudo touch /etc/by-sudo && stat -c %U /etc/by-sudo'), 'root')
    assert.equal(await run(sbx, 'cd /opt && sudo sh -c pwd && sudo -i pwd'), '/opt\n/root')
    const failed = await sbx.commands.run('sudo sh -c "exit 7"').catch((e) => e)
    assert.equal(failed.exitCode, 7, 'the command\'s exit status is sudo\'s')
    const missing = await sbx.commands.run('sudo no-such-command').catch((e) => e)
    assert.equal(missing.exitCode, 1)
    assert.match(missing.stderr, /sudo: no-such-command: command not found/)
    // As under nohup (which busybox lacks): sudo passes on no signal it ignores.
    assert.equal(await run(sbx, '(trap "" HUP; exec sudo sh -c "sleep 0.5; echo survived") > /tmp/nohup.out 2>&1 & s=$!; sleep 0.2; kill -HUP $s; wait $s; cat /tmp/nohup.out'), 'survived')
    // sudo killed: what it ran dies with it.
    assert.equal(await run(sbx, 'sudo sleep 1000 & s=$!; sleep 0.5; kill -9 $s; sleep 0.5; ps -o user,args | grep "^root .*[s]leep" || echo none'), 'none')
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

// copy's forceUpload, as on E2B: the files are uploaded again though the
// server has them, and the step is built anew, not reused.
test('Template builder: copy with forceUpload uploads again and builds anew', { skip }, async () => {
  const build = async (opts) => {
    const logs = []
    const t = Template({ fileContextPath: context }).fromImage(`${registry}/busybox:latest`).copy('notes.txt', '/opt/forced.txt', opts)
    await Template.build(t, 'forced', { onBuildLogs: (e) => logs.push(e.message) })
    return logs
  }
  await build()
  let logs = await build()
  assert.ok(logs.includes("Skipping upload of 'notes.txt', already cached"), logs.join('\n'))
  assert.ok(logs.some((l) => /reusing/.test(l)), logs.join('\n'))
  logs = await build({ forceUpload: true })
  assert.ok(logs.includes("Uploaded 'notes.txt'"), logs.join('\n'))
  assert.ok(!logs.some((l) => /reusing/.test(l)), logs.join('\n'))
  const sbx = await Sandbox.create('forced')
  try {
    assert.equal(await run(sbx, 'cat /opt/forced.txt'), readFileSync(join(context, 'notes.txt'), 'utf8').trim())
  } finally {
    await sbx.kill()
  }
})

// setUser takes any user the image has, as on E2B; a step as a user the
// image lacks fails the build, naming the user as envd does.
test('Template builder: setUser and steps as any user of the image; one it lacks fails', { skip }, async () => {
  // The image has app (uid 1500, home /home/app): imagetest.BusyboxImage.
  const t = Template({ fileContextPath: context }).fromImage(`${registry}/busybox:latest`)
    .setUser('app')
    .setWorkdir('/home/app')
    .runCmd('id -u > uid')
    .copy('notes.txt', '/home/app/notes.txt')
  await Template.build(t, 'appuser')
  const sbx = await Sandbox.create('appuser')
  try {
    assert.equal(await run(sbx, 'cat /home/app/uid'), '1500')
    assert.equal(await run(sbx, 'stat -c %u:%g /home/app/notes.txt'), '1500:1500')
    assert.equal(await run(sbx, 'id -u; echo $HOME', { user: 'app' }), '1500\n/home/app')
    assert.equal(await sbx.files.read('/home/app/notes.txt', { user: 'app' }), 'a note\n')
    await assert.rejects(sbx.commands.run('true', { user: 'ghost' }), /invalid username: 'ghost'/)
  } finally {
    await sbx.kill()
  }
  const base = () => Template().fromImage(`${registry}/busybox:latest`)
  await assert.rejects(Template.build(base().runCmd('true', { user: 'ghost' }), 'ghost-run'), (e) => e instanceof BuildError && /invalid username: 'ghost'/.test(e.message))
  await assert.rejects(Template.build(base().setUser('ghost'), 'ghost-user'), (e) => e instanceof BuildError && /USER ghost: invalid username: 'ghost'/.test(e.message))
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
  await assert.rejects(Template.build(Template().fromTemplate('bb-base').setUser('no body'), 'bb-x'), /"no body" is not a user name/)
  await assert.rejects(Template.build(base, 'Bad Name!'), /template name/)
})

// aptInstall and pipInstall as the SDK writes them (apt-get update and
// install as root, pip install as root), from a package repository and a
// wheel directory this test makes and copies into the build.
const noDebian = !process.env.AIRLOCK_DEBIAN_ROOT && 'AIRLOCK_DEBIAN_ROOT is not set (make test makes a Debian root with debootstrap)'
test('Template builder: aptInstall and pipInstall from local repositories, on a Debian image', { skip: skip || noDebian, timeout: 600_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'airlock-debian-'))
  try {
    // A .deb of one script, and a flat repository of it.
    const pkg = join(dir, 'pkg')
    mkdirSync(join(pkg, 'DEBIAN'), { recursive: true })
    mkdirSync(join(pkg, 'usr/bin'), { recursive: true })
    writeFileSync(join(pkg, 'DEBIAN/control'), 'Package: airlock-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: Airlock tests <tests@airlock.invalid>\nDescription: a package of the tests\n')
    writeFileSync(join(pkg, 'usr/bin/airlock-hello'), '#!/bin/sh\necho hello from a deb\n')
    chmodSync(join(pkg, 'usr/bin/airlock-hello'), 0o755)
    mkdirSync(join(dir, 'ctx/repo'), { recursive: true })
    execFileSync('dpkg-deb', ['--root-owner-group', '--build', pkg, join(dir, 'ctx/repo/airlock-hello_1.0_all.deb')], { stdio: 'ignore' })
    const deb = readFileSync(join(dir, 'ctx/repo/airlock-hello_1.0_all.deb'))
    writeFileSync(join(dir, 'ctx/repo/Packages'), readFileSync(join(pkg, 'DEBIAN/control'), 'utf8') +
      `Filename: ./airlock-hello_1.0_all.deb\nSize: ${statSync(join(dir, 'ctx/repo/airlock-hello_1.0_all.deb')).size}\nSHA256: ${createHash('sha256').update(deb).digest('hex')}\n\n`)
    // A wheel of one module, for pip's --find-links.
    mkdirSync(join(dir, 'ctx/wheels'), { recursive: true })
    execFileSync('python3', ['-c', `
import zipfile, sys
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    z.writestr('airlock_greet/__init__.py', 'def greet():\\n    return "hello from a wheel"\\n')
    z.writestr('airlock_greet-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: airlock-greet\\nVersion: 1.0\\n')
    z.writestr('airlock_greet-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: airlock-tests\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')
    z.writestr('airlock_greet-1.0.dist-info/RECORD', '')
`, join(dir, 'ctx/wheels/airlock_greet-1.0-py3-none-any.whl')])
    writeFileSync(join(dir, 'ctx/pip.conf'), '[global]\nno-index = true\nfind-links = /opt/wheels\nbreak-system-packages = true\n')
    const logs = []
    const t = Template({ fileContextPath: join(dir, 'ctx') })
      .fromImage(`${registry}/debian:latest`)
      .copy('repo', '/opt/repo/', { user: 'root' })
      .copy('wheels', '/opt/wheels/', { user: 'root' })
      .copy('pip.conf', '/etc/pip.conf', { user: 'root' })
      .runCmd('echo "deb [trusted=yes] file:/opt/repo ./" > /etc/apt/sources.list', { user: 'root' })
      .aptInstall(['airlock-hello'])
      .pipInstall(['airlock-greet'])
    await Template.build(t, 'debian-tools', { onBuildLogs: (e) => logs.push(e.message) })
    const sbx = await Sandbox.create('debian-tools')
    try {
      assert.equal(await run(sbx, 'airlock-hello'), 'hello from a deb')
      assert.equal(await run(sbx, 'python3 -c "import airlock_greet; print(airlock_greet.greet())"'), 'hello from a wheel')
      assert.match(await run(sbx, 'dpkg-query -W airlock-hello'), /airlock-hello\s+1\.0/)
      // Root inside installs more at run time, as in E2B's sandboxes.
      assert.match(await run(sbx, 'apt-get install -y --reinstall airlock-hello 2>&1 | tail -1; id -u', { user: 'root' }), /0$/)
    } finally {
      await sbx.kill()
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})
