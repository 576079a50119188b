// What the benchmarks share: percentiles, timing, and waiting for a pool.
import { sleep } from './harness.mjs'

export const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor((s.length - 1) * p / 100))] }
export const fmt = (xs) => `p50 ${pct(xs, 50).toFixed(2)} ms  p99 ${pct(xs, 99).toFixed(2)} ms  (n=${xs.length})`
export const time = async (f) => { const t = performance.now(); await f(); return performance.now() - t }

// poolReady waits (at most a minute) until template's pool holds n ready sandboxes.
export async function poolReady(server, template, n) {
  for (let i = 0; i < 1200; i++) {
    const m = await (await fetch(server.env.E2B_API_URL + '/metrics')).text()
    const got = Number(new RegExp(`airlock_pool_ready\\{template="${template}"\\} (\\d+)`).exec(m)?.[1] ?? 0)
    if (got >= n) return
    await sleep(50)
  }
  throw new Error(`the ${template} pool did not fill`)
}
