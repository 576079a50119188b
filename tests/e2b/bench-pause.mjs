// Pause and resume on gVisor: saved to disk (runsc checkpoint/restore)
// against frozen in memory (a server with pauseInMemory), side by side in
// one run, for sandboxes holding 16, 64 and 256 MiB of their own; the
// create-to-first-cell of a code interpreter sandbox beside them.
// Medians of 5 rounds each.
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox } from 'e2b'
import { startServer } from './harness.mjs'
import { pct, time } from './bench-util.mjs'

process.env.AIRLOCK_TEST_BACKEND = 'gvisor'
const cfg = join(mkdtempSync(join(tmpdir(), 'airlock-bench-pause-')), 'airlock.json')
writeFileSync(cfg, JSON.stringify({ pauseInMemory: true, templates: { base: { memory: '1G' } } }))
const cfgDisk = cfg.replace('airlock.json', 'disk.json')
writeFileSync(cfgDisk, JSON.stringify({ templates: { base: { memory: '1G' } } }))

const rounds = 5
const results = {}
for (const [mode, file] of [['disk', cfgDisk], ['memory', cfg]]) {
  const server = await startServer(['--config', file, '--pool-size', '0'])
  try {
  for (const mib of [16, 64, 256]) {
    const pause = [], resume = []
    const sbx = await Sandbox.create('base', { timeoutMs: 600_000 })
    // Memory of its own, touched: a process that holds it while paused.
    await sbx.commands.run(`python3 -c "import time; b = bytearray(${mib} << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; open('/tmp/ready', 'w'); time.sleep(100000)"`, { background: true })
    while ((await sbx.commands.run('test -e /tmp/ready && echo y || true')).stdout.trim() !== 'y') await new Promise((r) => setTimeout(r, 100))
    for (let i = 0; i < rounds; i++) {
      pause.push(await time(() => sbx.pause()))
      resume.push(await time(() => Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 })))
    }
    await sbx.kill()
    results[`${mode} ${mib}`] = { pause: pct(pause, 50), resume: pct(resume, 50) }
  }
  } finally {
    await server.stop() // a failed round must not leave a server behind
  }
}
console.log(`gVisor pause/resume, medians of ${rounds} (ms): to disk vs in memory`)
for (const mib of [16, 64, 256]) {
  const d = results[`disk ${mib}`], m = results[`memory ${mib}`]
  console.log(`${String(mib).padStart(4)} MiB  pause ${d.pause.toFixed(0).padStart(5)} vs ${m.pause.toFixed(0).padStart(4)} (${(d.pause / m.pause).toFixed(1)}x)   resume ${d.resume.toFixed(0).padStart(5)} vs ${m.resume.toFixed(0).padStart(4)} (${(d.resume / m.resume).toFixed(1)}x)`)
}
