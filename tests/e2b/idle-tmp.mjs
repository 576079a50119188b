import { startServer, sleep } from './harness.mjs'
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
const n = Number(process.argv[2])
const cfg = join(mkdtempSync(join(tmpdir(), 'airlock-idle-')), 'airlock.json')
writeFileSync(cfg, JSON.stringify({ poolMemoryBudget: '8G', templates: { 'code-interpreter-v1': { poolSize: 0 } } }))
const server = await startServer(['--pool-size', String(n), '--config', cfg])
for (;;) { const m = await (await fetch(server.env.E2B_API_URL + '/metrics')).text(); if (Number(/airlock_pool_ready\{template="base"\} (\d+)/.exec(m)?.[1] ?? 0) >= n) break; await sleep(100) }
await sleep(3000)
const xs = []
for (let i = 0; i < 500; i++) { const t = performance.now(); await fetch(server.env.E2B_API_URL + '/health').then((r) => r.text()); xs.push(performance.now() - t); await sleep(2) }
xs.sort((a, b) => a - b)
console.log(`pool ${n}: /health p50 ${xs[250].toFixed(2)} p90 ${xs[450].toFixed(2)} p99 ${xs[495].toFixed(2)} ms`)
await server.stop(); rmSync(dirname(cfg), { recursive: true })
