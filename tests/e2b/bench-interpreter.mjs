// Benchmark of the code interpreter through @e2b/code-interpreter. Prints
// medians and 99th percentiles; asserts nothing. Baselines in the same run:
// a bare HTTP round trip to the daemon, and the same cell sent straight to
// an ipykernel on the host with jupyter_client (raw-kernel.py).
import { execFileSync } from 'node:child_process'
import { Sandbox } from '@e2b/code-interpreter'
import { pct, fmt, time, poolReady } from './bench-util.mjs'
import { startServer, sleep } from './harness.mjs'

const raw = JSON.parse(execFileSync('/usr/bin/python3', [new URL('raw-kernel.py', import.meta.url).pathname, '200'],
  { stdio: ['ignore', 'pipe', 'ignore'] }).toString())

const server = await startServer(['--pool-size', '2'])
const floor = []
for (let i = 0; i < 200; i++) floor.push(await time(() => fetch(server.env.E2B_API_URL + '/health').then((r) => r.text())))

const sbx = await Sandbox.create()
for (let i = 0; i < 10; i++) await sbx.runCode('1+1')
// Let the pool's replacement start its kernel (over a second of CPU)
// before measuring.
await poolReady(server, 'code-interpreter-v1', 2)
await sleep(3000)
const cells = []
for (let i = 0; i < 200; i++) cells.push(await time(() => sbx.runCode('1+1')))
await sbx.kill()

const first = []
for (let i = 0; i < 15; i++) {
  await poolReady(server, 'code-interpreter-v1', 1)
  // The kernel of a pooled sandbox starts (and imports matplotlib) in
  // the background: give it the time a real pool would have had.
  await sleep(1500)
  let s
  first.push(await time(async () => {
    s = await Sandbox.create()
    const r = await s.runCode('1+1')
    if (r.text !== '2') throw new Error('bad answer ' + r.text)
  }))
  await s.kill()
}

// Per language: a warm round trip of its 1 + 1, and a pooled sandbox's
// first cell in it (only Python's kernel is started in the pool).
const one = { python: '1+1', js: '1+1', ts: 'const n: number = 1; n + 1', r: '1+1', bash: 'echo $((1+1))' }
const perLanguage = {}
for (const [language, code] of Object.entries(one)) {
  const firsts = []
  for (let i = 0; i < 5; i++) {
    await poolReady(server, 'code-interpreter-v1', 1)
    await sleep(1500)
    let s
    firsts.push(await time(async () => {
      s = await Sandbox.create()
      const r = await s.runCode(code, { language })
      if (r.error) throw new Error(`${language}: ${r.error.value}`)
    }))
    if (i < 4) await s.kill()
    else {
      const warm = []
      for (let j = 0; j < 50; j++) warm.push(await time(() => s.runCode(code, { language })))
      perLanguage[language] = { firsts, warm }
      await s.kill()
    }
  }
}
await server.stop()

console.log('code interpreter through @e2b/code-interpreter 2.8.0')
for (const [language, { firsts, warm }] of Object.entries(perLanguage)) {
  console.log(`  ${language.padEnd(7)} runCode(1+1) warm p50 ${pct(warm, 50).toFixed(1)} ms (${(pct(warm, 50) / pct(raw, 50)).toFixed(2)}x raw ipykernel); create + first cell p50 ${pct(firsts, 50).toFixed(0)} ms`)
}
console.log(`  baseline: HTTP GET /health                  ${fmt(floor)}`)
console.log(`  baseline: raw ipykernel, jupyter_client     ${fmt(raw)}`)
console.log(`  runCode('1+1') in a warm context            ${fmt(cells)}   ${(pct(cells, 50) / pct(raw, 50)).toFixed(2)}x raw ipykernel`)
console.log(`  Sandbox.create() + first runCode, from pool ${fmt(first)}`)
