// E2B's volumes through the SDK's Volume and Sandbox.create({volumeMounts}):
// a volume made and written from outside, mounted by two sandboxes at
// once (one writes, the other reads, as user and as root), filled to its
// size (ENOSPC inside, the host's disk untouched beyond it), entries a sandbox left there that lead outside or block
// refused by the file operations, and everything kept across kill -9 of
// the daemon and read back once the sandboxes are gone.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { Sandbox, Volume, VolumeError, VolumeNotFoundError, CommandExitError } from 'e2b'
import { startServer } from './harness.mjs'

// Small volumes: filling one is quick.
const config = { volumes: { size: '32M' } }
let server = await startServer([], { config })
after(async () => { await server?.stop() })

const run = async (sbx, cmd, opts) => {
  try {
    return await sbx.commands.run(cmd, opts)
  } catch (e) {
    if (e instanceof CommandExitError) return e
    throw e
  }
}

test('volumes: made, shared by two sandboxes, full at their size, safe against what sandboxes leave, kept across kill -9', { timeout: 300_000 }, async () => {
  const vol = await Volume.create('data')
  assert.match(vol.volumeId, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
  assert.ok(vol.token, 'a token for its files')
  assert.deepEqual((await Volume.list()).map((v) => v.name), ['data'])
  assert.equal((await Volume.getInfo(vol.volumeId)).name, 'data')
  await assert.rejects(Volume.create('data'), (e) => e instanceof VolumeError && /400.*already exists/.test(e.message))
  await assert.rejects(Volume.create('no/slash'), (e) => e instanceof VolumeError && /400/.test(e.message))

  // Written from outside, without a sandbox.
  await vol.makeDir('/in/deep', { force: true })
  const written = await vol.writeFile('/in/hello.txt', 'hello from outside')
  assert.equal(written.type, 'file')
  assert.equal(written.size, 18)
  await assert.rejects(vol.writeFile('/in/hello.txt', 'again'), /409/)
  await vol.writeFile('/in/hello.txt', 'hello from outside', { force: true })
  assert.equal(await vol.readFile('/in/hello.txt'), 'hello from outside')
  assert.ok(await vol.exists('/in/deep'))
  assert.ok(!(await vol.exists('/nothing')))
  assert.deepEqual((await vol.list('/', { depth: 2 })).map((e) => e.path), ['/in', '/in/deep', '/in/hello.txt'])
  assert.equal((await vol.updateMetadata('/in/hello.txt', { mode: 0o640 })).mode, 0o640)

  // Mounted by two sandboxes at once: what one writes, the other reads,
  // owned by user (1000) in both, root's by root.
  const a = await Sandbox.create({ volumeMounts: { '/mnt/data': 'data' } })
  const b = await Sandbox.create({ volumeMounts: { '/mnt/data': vol } })
  try {
    assert.deepEqual((await Sandbox.getInfo(a.sandboxId)).volumeMounts, [{ name: 'data', path: '/mnt/data' }])
    assert.equal((await a.commands.run('cat /mnt/data/in/hello.txt')).stdout, 'hello from outside')
    await a.commands.run('echo from-a > /mnt/data/a.txt')
    assert.equal((await b.commands.run('cat /mnt/data/a.txt; stat -c %u:%g /mnt/data/a.txt /mnt/data')).stdout, 'from-a\n1000:1000\n1000:1000\n')
    await b.commands.run('echo from-b >> /mnt/data/a.txt')
    assert.equal((await a.commands.run('cat /mnt/data/a.txt')).stdout, 'from-a\nfrom-b\n')
    if ((await run(b, 'command -v sudo')).exitCode === 0) {
      await b.commands.run('sudo sh -c "echo root > /mnt/data/root.txt"')
      assert.equal((await a.commands.run('stat -c %u /mnt/data/root.txt')).stdout, '0\n')
    }
    assert.equal((await vol.readFile('/a.txt')), 'from-a\nfrom-b\n')

    // Full at its size: ENOSPC inside, the host's disk untouched beyond
    // the space the volume reserved when it was made.
    const image = join(server.stateDir, 'volumes', vol.volumeId, 'image')
    const fill = await run(a, 'dd if=/dev/zero of=/mnt/data/fill bs=1M count=64')
    assert.notEqual(fill.exitCode, 0)
    assert.match(fill.stderr, /No space left on device/)
    const after = statSync(image)
    assert.equal(after.size, 32 << 20)
    assert.ok(after.blocks * 512 <= (32 << 20) + (1 << 20), `the image holds ${after.blocks * 512} bytes of the host's disk: no more than its size`)
    await a.commands.run('rm /mnt/data/fill')

    // What a sandbox may leave there: links out, a FIFO. The file
    // operations refuse them (never follow, never block).
    await a.commands.run('ln -s /etc/passwd /mnt/data/evil; ln -s / /mnt/data/rootlink; mkfifo /mnt/data/fifo')
    // gVisor keeps a FIFO made in a host mount in its own memory: the
    // volume then has none.
    const fifo = await vol.exists('/fifo')
    for (const p of ['/evil', '/rootlink/etc/passwd', ...(fifo ? ['/fifo'] : [])]) {
      await assert.rejects(vol.readFile(p), (e) => e instanceof VolumeError, `read ${p}`)
      await assert.rejects(vol.writeFile(p, 'pwned', { force: true }), (e) => e instanceof VolumeError, `write ${p}`)
    }
    const evil = (await vol.list('/')).find((e) => e.name === 'evil')
    assert.equal(evil.type, 'symlink')
    assert.equal(evil.target, '/etc/passwd')
    await vol.remove('/rootlink')
    assert.ok(readFileSync('/etc/passwd', 'utf8').startsWith('root:'), "the host's /etc/passwd")
    const names = (await a.commands.run('ls /mnt/data')).stdout.split('\n')
    for (const n of ['a.txt', 'evil', 'fifo', 'in']) assert.ok(names.includes(n), `${n} in ${names}`)
    if (fifo) assert.equal((await vol.getInfo('/fifo')).type, 'unknown')
    assert.ok(!names.includes('rootlink'), 'the removed link is gone')
  } finally {
    await a.kill()
    await b.kill()
  }

  // Kept across kill -9 of the daemon, read back with no sandbox left.
  await server.crash()
  server = await startServer([], { config, stateDir: server.stateDir, apiKey: server.apiKey })
  const again = await Volume.connect(vol.volumeId)
  assert.equal(await again.readFile('/a.txt'), 'from-a\nfrom-b\n')
  const c = await Sandbox.create({ volumeMounts: { '/data': 'data' } })
  assert.equal((await c.commands.run('cat /data/in/hello.txt')).stdout, 'hello from outside')
  await c.kill()

  assert.equal(await Volume.destroy(vol.volumeId), true)
  assert.equal(await Volume.destroy(vol.volumeId), false)
  await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
})

test('volume mounts that cannot be: an unknown volume, a relative or repeated path, each a 400 naming it', async () => {
  await assert.rejects(Sandbox.create({ volumeMounts: { '/mnt/x': 'nope' } }), /volume 'nope' not found/)
  await Volume.create('other')
  await assert.rejects(Sandbox.create({ volumeMounts: { 'relative/x': 'other' } }), /path must be absolute/)
  await assert.rejects(Sandbox.create({ volumeMounts: { '/proc/x': 'other' } }), /reserved/)
})

test('fork, snapshot and pause to disk of a sandbox with a volume: the copies and the resumed one mount it again, live, as on E2B', { skip: process.env.AIRLOCK_TEST_BACKEND !== 'gvisor' && 'snapshots and forks are the gvisor backend\'s', timeout: 300_000 }, async () => {
  await Volume.create('forked')
  const sbx = await Sandbox.create({ volumeMounts: { '/mnt/v': 'forked' } })
  const others = []
  try {
    await sbx.commands.run('echo original > /mnt/v/o.txt')
    const [copy] = await sbx.fork({ count: 1 })
    others.push(copy)
    assert.deepEqual((await Sandbox.getInfo(copy.sandboxId)).volumeMounts, [{ name: 'forked', path: '/mnt/v' }])
    assert.equal((await copy.commands.run('cat /mnt/v/o.txt')).stdout, 'original\n')
    // The same volume, not a copy of it: what one writes the other reads.
    await copy.commands.run('echo copy > /mnt/v/c.txt')
    assert.equal((await sbx.commands.run('cat /mnt/v/c.txt')).stdout, 'copy\n')
    const snap = await sbx.createSnapshot()
    const fromSnap = await Sandbox.create(snap.snapshotId)
    others.push(fromSnap)
    assert.equal((await fromSnap.commands.run('cat /mnt/v/c.txt')).stdout, 'copy\n')
    assert.deepEqual((await Sandbox.getInfo(fromSnap.sandboxId)).volumeMounts, [{ name: 'forked', path: '/mnt/v' }])
    await Sandbox.deleteSnapshot(snap.snapshotId)
    // Paused to disk and resumed: its volume mounted again, live.
    await sbx.pause()
    await copy.commands.run('echo while-paused > /mnt/v/p.txt')
    const back = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await back.commands.run('cat /mnt/v/p.txt')).stdout, 'while-paused\n')
  } finally {
    for (const s of [sbx, ...others]) await s.kill()
  }
})
