// The pools: per template, the sandboxes ready, the size kept, those
// starting, and the memory of the ready ones against the budget.
import { useState } from 'preact/hooks'
import { bytes, listPools, type Pool } from './api'
import { usePoll } from './poll'

export function Pools() {
  const [data, setData] = useState<{ pools: Pool[]; memoryBudgetBytes: number } | null>(null)
  const [error, setError] = useState('')
  usePoll((wanted) => listPools().then((d) => wanted() && setData(d)).catch((e) => setError(String(e))), 2000, [])
  if (!data) return <p>{error || 'Loading…'}</p>
  const used = data.pools.reduce((n, p) => n + p.memoryBytes, 0)
  return (
    <section>
      <h2>Pools</h2>
      <p>Memory of ready sandboxes: {bytes(used)}{data.memoryBudgetBytes ? ` of a budget of ${bytes(data.memoryBudgetBytes)}` : ' (no budget)'}</p>
      <table class="pools">
        <thead><tr><th>template</th><th>ready</th><th>size</th><th>starting</th><th>memory</th></tr></thead>
        <tbody>
          {data.pools.map((p) => (
            <tr data-template={p.template}>
              <td>{p.template}</td><td>{p.ready}</td><td>{p.size}</td><td>{p.starting}</td><td>{bytes(p.memoryBytes)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  )
}
