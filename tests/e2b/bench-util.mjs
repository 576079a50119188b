// What the benchmarks share: percentiles, timing, and waiting for a pool.
import { sleep } from './harness.mjs'

export const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor((s.length - 1) * p / 100))] }
export const fmt = (xs) => `p50 ${pct(xs, 50).toFixed(2)} ms  p99 ${pct(xs, 99).toFixed(2)} ms  (n=${xs.length})`
export const time = async (f) => { const t = performance.now(); await f(); return performance.now() - t }

// metric reads one sample of the server's metrics (0 if it has none).
export async function metric(server, sample) {
  const m = await (await fetch(server.env.E2B_API_URL + '/metrics', { headers: { 'X-API-KEY': server.apiKey } })).text()
  const line = m.split('\n').find((l) => l.startsWith(sample + ' '))
  return Number(line?.slice(sample.length + 1) ?? 0)
}

// poolReady waits (at most limitMs) until template's pool holds n ready sandboxes.
export async function poolReady(server, template, n, limitMs = 60_000) {
  for (const end = Date.now() + limitMs; Date.now() < end; await sleep(50)) {
    if (await metric(server, `airlock_pool_ready{template="${template}"}`) >= n) return
  }
  throw new Error(`the ${template} pool did not fill`)
}
