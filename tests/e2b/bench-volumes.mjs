// Volumes' throughput against the host's own disk, side by side, medians
// of 5 rounds (`make bench-volumes` runs it on each backend):
// - inside a sandbox, dd of 256 MiB written with an fsync and read back
//   (from the page cache, as a second read is) on the mounted volume,
//   against the same dd on the host in a directory of the same disk;
// - without a sandbox, the SDK's Volume.writeFile and readFile of 64 MiB,
//   against Node writing (with an fsync) and reading the same bytes on
//   the host.
import { mkdtempSync, rmSync, writeFileSync, readFileSync, openSync, fsyncSync, closeSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
import { join } from 'node:path'
import { Sandbox, Volume } from 'e2b'
import { startServer } from './harness.mjs'
import { pct, time } from './bench-util.mjs'

const rounds = 5
const median = async (f) => {
  const xs = []
  for (let i = 0; i < rounds; i++) xs.push(await f())
  return pct(xs, 50)
}
const ddMB = 256
// dd's own figure: "… copied, 0.5 s, 512 MB/s" (its last line).
const ddSeconds = (stderr) => Number(stderr.trim().split('\n').pop().match(/, ([\d.]+) s,/)[1])

const server = await startServer([], { config: { volumes: { size: '1G' } } })
const hostDir = mkdtempSync(join(server.stateDir, 'bench-'))
try {
  const vol = await Volume.create('bench')
  const sbx = await Sandbox.create({ volumeMounts: { '/mnt/data': 'bench' }, timeoutMs: 600_000 })
  const inSandbox = (cmd) => sbx.commands.run(cmd, { timeoutMs: 120_000 })

  const write = {
    volume: await median(async () => ddSeconds((await inSandbox(`dd if=/dev/zero of=/mnt/data/f bs=1M count=${ddMB} conv=fsync 2>&1 >/dev/null`)).stdout)),
    host: await median(async () => ddSeconds(execFileSync('sh', ['-c', `dd if=/dev/zero of=${hostDir}/f bs=1M count=${ddMB} conv=fsync 2>&1 >/dev/null`], { encoding: 'utf8' }))),
  }
  const read = {
    volume: await median(async () => ddSeconds((await inSandbox('dd if=/mnt/data/f of=/dev/null bs=1M 2>&1')).stdout)),
    host: await median(async () => ddSeconds(execFileSync('sh', ['-c', `dd if=${hostDir}/f of=/dev/null bs=1M 2>&1`], { encoding: 'utf8' }))),
  }
  await sbx.kill()

  const data = Buffer.alloc(64 << 20, 7)
  let n = 0
  const api = {
    write: await median(() => time(() => vol.writeFile(`/api${n++}`, data))),
    read: await median(() => time(async () => { await vol.readFile('/api0', { format: 'bytes' }) })),
  }
  const local = {
    write: await median(() => time(async () => {
      const p = join(hostDir, `local${n++}`)
      writeFileSync(p, data)
      const fd = openSync(p, 'r+')
      fsyncSync(fd)
      closeSync(fd)
    })),
    read: await median(() => time(async () => { readFileSync(join(hostDir, 'local' + (n - 1))) })),
  }
  await Volume.destroy(vol.volumeId)

  const mbps = (mb, s) => (mb / s).toFixed(0)
  console.log(`volumes, ${process.env.AIRLOCK_TEST_BACKEND || 'namespaces'} backend, medians of ${rounds}\n`)
  // Each ratio is the volume's time over the host's.
  console.log(`dd ${ddMB} MiB, write + fsync   volume ${mbps(ddMB, write.volume)} MB/s   host ${mbps(ddMB, write.host)} MB/s   ${(write.volume / write.host).toFixed(2)}x the host's time`)
  console.log(`dd ${ddMB} MiB, read (cached)   volume ${mbps(ddMB, read.volume)} MB/s   host ${mbps(ddMB, read.host)} MB/s   ${(read.volume / read.host).toFixed(2)}x`)
  console.log(`API writeFile 64 MiB          ${api.write.toFixed(0)} ms   host ${local.write.toFixed(0)} ms   ${(api.write / local.write).toFixed(2)}x`)
  console.log(`API readFile 64 MiB           ${api.read.toFixed(0)} ms   host ${local.read.toFixed(0)} ms   ${(api.read / local.read).toFixed(2)}x`)
} finally {
  rmSync(hostDir, { recursive: true, force: true })
  await server.stop()
}
