// Airlock on three nodes behind a router, against a real API server
// (cluster-harness.mjs): what the router adds to a create, against the
// same create straight to a node in the same run, and creates per second
// across the three nodes against one node alone. The three "hosts" share
// this machine's cores, so the throughput ratio says what routing costs,
// not what more hosts give.
import { Sandbox } from 'e2b'
import { unavailable, startCluster } from './cluster-harness.mjs'

const why = unavailable()
if (why) {
  console.log(`bench-cluster: ${why}`)
  process.exit(1)
}
const N = Number(process.env.N ?? 30)
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const ms = (x) => `${x.toFixed(1)} ms`

const c = await startCluster({ nodes: 3, poolSize: 0 })
try {
  const node = c.nodes[0]
  const direct = { ...c.opts, apiUrl: node.url, sandboxUrl: node.url }
  const timeCreate = async (opts) => {
    const t = performance.now()
    const sb = await Sandbox.create('base', opts)
    const dt = performance.now() - t
    await sb.kill()
    return dt
  }
  // Warm both paths (connections, caches), then interleave.
  await timeCreate(c.opts)
  await timeCreate(direct)
  const routed = []
  const straight = []
  for (let i = 0; i < N; i++) {
    routed.push(await timeCreate(c.opts))
    straight.push(await timeCreate(direct))
  }
  console.log(`create (cold, template base), median of ${N}, same run:`)
  console.log(`  straight to a node  ${ms(median(straight))}`)
  console.log(`  through the router  ${ms(median(routed))}   ×${(median(routed) / median(straight)).toFixed(2)}  (+${ms(median(routed) - median(straight))})`)

  // Throughput: K creates, C at a time, then K kills.
  const K = 3 * N
  const C = 6
  const rate = async (optsOf) => {
    let next = 0
    const boxes = []
    const t = performance.now()
    await Promise.all(Array.from({ length: C }, async () => {
      while (next < K) {
        next++
        boxes.push(await Sandbox.create('base', optsOf()))
      }
    }))
    const secs = (performance.now() - t) / 1000
    await Promise.all(boxes.map((b) => b.kill()))
    return K / secs
  }
  const one = await rate(() => direct)
  const three = await rate(() => c.opts)
  console.log(`creates per second, ${K} creates ${C} at a time:`)
  console.log(`  one node, straight       ${one.toFixed(1)}/s`)
  console.log(`  three nodes, the router  ${three.toFixed(1)}/s   ×${(three / one).toFixed(2)}`)
} finally {
  await c.close()
}
