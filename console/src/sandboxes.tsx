// The live table of sandboxes: their state, age, time left and use, with
// filters and the actions an operator takes.
import { useState } from 'preact/hooks'
import { actions, AuthError, bytes, duration, listSandboxes, metricsOf, type Listed, type Metric } from './api'
import { usePoll } from './poll'

const every = 2000 // ms between refreshes

export function Sandboxes({ onAuthError }: { onAuthError: () => void }) {
  const [rows, setRows] = useState<Listed[] | null>(null)
  const [use, setUse] = useState<Record<string, Metric>>({})
  const [error, setError] = useState('')
  const [busy, setBusy] = useState('')
  const [filter, setFilter] = useState({ state: '', template: '', metadata: '' })
  const [tick, setTick] = useState(0)

  usePoll(async (wanted) => {
    try {
      const list = await listSandboxes()
      if (!wanted()) return
      setRows(list)
      setError('')
      const ms = await Promise.all(list.filter((s) => s.state === 'running').map(async (s) => {
        try {
          const m = await metricsOf(s.sandboxID)
          return [s.sandboxID, m[m.length - 1]] as const
        } catch {
          return [s.sandboxID, undefined] as const
        }
      }))
      if (wanted()) setUse(Object.fromEntries(ms.filter((e): e is readonly [string, Metric] => e[1] !== undefined)))
    } catch (err) {
      if (err instanceof AuthError) onAuthError()
      else if (wanted()) setError(String(err))
    }
  }, every, [tick])

  const act = async (what: string, f: () => Promise<unknown>) => {
    setBusy(what)
    try {
      await f()
    } catch (err) {
      setError(`${what}: ${err}`)
    } finally {
      setBusy('')
      setTick((n) => n + 1)
    }
  }

  if (rows === null) return <p>Loading…</p>
  const templates = [...new Set(rows.map((r) => r.templateID))].sort()
  const [mk, mv] = filter.metadata.split('=')
  const shown = rows.filter((r) =>
    (!filter.state || r.state === filter.state) &&
    (!filter.template || r.templateID === filter.template) &&
    (!filter.metadata || Object.entries(r.metadata ?? {}).some(([k, v]) => k === mk.trim() && (mv === undefined || v === mv.trim()))))
  const now = Date.now()
  return (
    <section>
      <h2>Sandboxes <small>{shown.length} of {rows.length}</small></h2>
      <div class="filters">
        <select aria-label="state" value={filter.state} onChange={(e) => setFilter({ ...filter, state: (e.target as HTMLSelectElement).value })}>
          <option value="">every state</option>
          <option value="running">running</option>
          <option value="paused">paused</option>
        </select>
        <select aria-label="template" value={filter.template} onChange={(e) => setFilter({ ...filter, template: (e.target as HTMLSelectElement).value })}>
          <option value="">every template</option>
          {templates.map((t) => <option value={t}>{t}</option>)}
        </select>
        <input aria-label="metadata" placeholder="metadata key=value" value={filter.metadata} onInput={(e) => setFilter({ ...filter, metadata: (e.target as HTMLInputElement).value })} />
      </div>
      {error && <p class="error" role="alert">{error}</p>}
      <table class="sandboxes">
        <thead>
          <tr><th>id</th><th>template</th><th>backend</th><th>state</th><th>age</th><th>time left</th><th>CPU</th><th>memory</th><th>disk</th><th>metadata</th><th></th></tr>
        </thead>
        <tbody>
          {shown.map((s) => {
            const m = use[s.sandboxID]
            return (
              <tr data-id={s.sandboxID}>
                <td><a href={`#/sandboxes/${encodeURIComponent(s.sandboxID)}`}>{s.sandboxID}</a></td>
                <td>{s.templateID}</td>
                <td>{s.backend ?? ''}</td>
                <td class={s.state}>{s.state}</td>
                <td>{duration(now - Date.parse(s.startedAt))}</td>
                <td>{duration(Date.parse(s.endAt) - now)}</td>
                <td>{m ? `${m.cpuUsedPct.toFixed(0)} %` : '–'}</td>
                <td>{m ? `${bytes(m.memUsed)} / ${bytes(m.memTotal)}` : '–'}</td>
                <td>{m ? `${bytes(m.diskUsed)} / ${bytes(m.diskTotal)}` : '–'}</td>
                <td class="meta">{Object.entries(s.metadata ?? {}).map(([k, v]) => <span>{k}={v}</span>)}</td>
                <td class="actions">
                  <button disabled={!!busy} onClick={() => act('extend', () => actions.extend(s.sandboxID, Math.max(0, Date.parse(s.endAt) - now) + 5 * 60_000))}>+5 min</button>
                  {s.state === 'running'
                    ? <button disabled={!!busy} onClick={() => act('pause', () => actions.pause(s.sandboxID))}>pause</button>
                    : <button disabled={!!busy} onClick={() => act('resume', () => actions.resume(s.sandboxID))}>resume</button>}
                  <button class="danger" disabled={!!busy} onClick={() => act('kill', () => actions.kill(s.sandboxID))}>kill</button>
                </td>
              </tr>
            )
          })}
        </tbody>
      </table>
      {shown.length === 0 && <p class="empty">No sandbox{rows.length ? ' matches' : ' runs'}.</p>}
    </section>
  )
}
