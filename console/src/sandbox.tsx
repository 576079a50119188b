// One sandbox: its metrics over the last quarter hour as small charts,
// its processes, its files (list, download, upload), and its audit trail
// (what it reached or tried to, the API's actions on it) with the
// allowlist that covers it.
import { useEffect, useState } from 'preact/hooks'
import type { Sandbox } from 'e2b'
import { allowlistOf, api, auditOf, bytes, connect, metricsOf, type AuditEvent, type Listed, type Metric } from './api'
import { usePoll } from './poll'

// Spark draws values (oldest first) as a line in an SVG of its own; the
// console never puts markup it did not make into the page.
function Spark({ values, max, label, text }: { values: number[]; max: number; label: string; text: string }) {
  const w = 240
  const h = 48
  const top = Math.max(max, ...values, 1e-9)
  // One sample is a level line, until the next comes (every 5 s).
  const vs = values.length === 1 ? [values[0], values[0]] : values
  const pts = vs.map((v, i) => `${(i / Math.max(1, vs.length - 1)) * w},${h - (v / top) * (h - 2) - 1}`).join(' ')
  return (
    <figure class="spark">
      <svg width={w} height={h} viewBox={`0 0 ${w} ${h}`} role="img" aria-label={label}>
        <polyline points={pts} fill="none" stroke="currentColor" stroke-width="1.5" />
      </svg>
      <figcaption>{label}: {text}</figcaption>
    </figure>
  )
}

function Metrics({ id }: { id: string }) {
  const [ms, setMs] = useState<Metric[]>([])
  usePoll((wanted) => metricsOf(id, new Date(Date.now() - 15 * 60_000)).then((m) => wanted() && setMs(m)), 5000, [id])
  const last = ms[ms.length - 1]
  if (!last) return <p>No metrics yet.</p>
  return (
    <div class="metrics">
      <Spark label="CPU" values={ms.map((m) => m.cpuUsedPct)} max={100} text={`${last.cpuUsedPct.toFixed(0)} % of ${last.cpuCount}`} />
      <Spark label="memory" values={ms.map((m) => m.memUsed)} max={last.memTotal} text={`${bytes(last.memUsed)} of ${bytes(last.memTotal)}`} />
      <Spark label="disk" values={ms.map((m) => m.diskUsed)} max={last.diskTotal} text={`${bytes(last.diskUsed)} of ${bytes(last.diskTotal)}`} />
    </div>
  )
}

function Processes({ sbx }: { sbx: Sandbox }) {
  const [procs, setProcs] = useState<{ pid: number; cmd: string; args: string[] }[]>([])
  usePoll((wanted) => sbx.commands.list().then((p) => wanted() && setProcs(p)), 3000, [sbx])
  return (
    <table class="procs">
      <thead><tr><th>pid</th><th>command</th></tr></thead>
      <tbody>{procs.map((p) => <tr><td>{p.pid}</td><td>{[p.cmd, ...p.args].join(' ')}</td></tr>)}</tbody>
    </table>
  )
}

function Files({ sbx }: { sbx: Sandbox }) {
  const [dir, setDir] = useState('/home/user')
  const [entries, setEntries] = useState<{ name: string; path: string; type?: string; size: number }[]>([])
  const [error, setError] = useState('')
  const [tick, setTick] = useState(0)
  useEffect(() => {
    sbx.files.list(dir).then((es) => {
      setEntries([...es].sort((a, b) => (a.type === b.type ? a.name.localeCompare(b.name) : a.type === 'dir' ? -1 : 1)))
      setError('')
    }).catch((e) => setError(String(e)))
  }, [sbx, dir, tick])
  const download = async (path: string, name: string) => {
    const blob = await sbx.files.read(path, { format: 'blob' })
    const url = URL.createObjectURL(blob)
    const a = document.createElement('a')
    a.href = url
    a.download = name
    a.click()
    setTimeout(() => URL.revokeObjectURL(url), 10_000)
  }
  const upload = async (e: Event) => {
    const input = e.target as HTMLInputElement
    for (const f of Array.from(input.files ?? [])) await sbx.files.write(`${dir}/${f.name}`, await f.arrayBuffer())
    input.value = ''
    setTick((n) => n + 1)
  }
  const up = dir === '/' ? null : dir.replace(/\/[^/]*$/, '') || '/'
  return (
    <div class="files">
      <p class="path"><code>{dir}</code> <label class="upload">upload <input type="file" multiple onChange={upload} /></label></p>
      {error && <p class="error">{error}</p>}
      <table>
        <tbody>
          {up !== null && <tr><td><button class="link" onClick={() => setDir(up)}>..</button></td><td></td></tr>}
          {entries.map((e) => (
            <tr>
              <td>{e.type === 'dir'
                ? <button class="link" onClick={() => setDir(e.path)}>{e.name}/</button>
                : <button class="link" onClick={() => download(e.path, e.name)}>{e.name}</button>}</td>
              <td>{e.type === 'dir' ? '' : bytes(e.size)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  )
}

// Audit shows the trail's last events, newest first, and the allowlist
// that covers every host the sandbox reached.
function Audit({ id }: { id: string }) {
  const [events, setEvents] = useState<AuditEvent[]>([])
  const [allow, setAllow] = useState<string[]>([])
  const [error, setError] = useState('')
  usePoll((wanted) => Promise.all([auditOf(id), allowlistOf(id)]).then(([t, a]) => {
    if (!wanted()) return
    setEvents(t.events.slice(-200).reverse())
    setAllow(a.allowOut)
    setError('')
  }).catch((e) => { if (wanted()) setError(String(e)) }), 5000, [id])
  const what = (e: AuditEvent) => e.kind === 'api'
    ? `${e.action ?? ''} by ${e.actor ?? ''}`
    : [e.proto, e.name, e.addr && `${e.addr}${e.port ? ':' + e.port : ''}`].filter(Boolean).join(' ')
  return (
    <div class="audit">
      {error && <p class="error">{error}</p>}
      <p>Allowlist that covers what it reached: <code>{allow.length ? allow.join(', ') : '(nothing yet)'}</code></p>
      <table>
        <thead><tr><th>time</th><th>kind</th><th>what</th><th>decision</th><th>bytes out / in</th></tr></thead>
        <tbody>
          {events.map((e) => (
            <tr class={e.decision === 'denied' ? 'denied' : ''}>
              <td>{new Date(e.time).toLocaleTimeString()}</td>
              <td>{e.kind}</td>
              <td>{what(e)}</td>
              <td>{e.kind === 'api' ? String(e.status ?? '') : [e.decision, e.rule].filter(Boolean).join(': ')}{e.kind === 'dropped' ? `${e.count} not kept` : ''}</td>
              <td>{e.sent || e.received ? `${bytes(e.sent ?? 0)} / ${bytes(e.received ?? 0)}` : ''}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  )
}

export function SandboxPage({ id }: { id: string }) {
  const [sbx, setSbx] = useState<Sandbox | null>(null)
  const [error, setError] = useState('')
  const [state, setState] = useState('')
  useEffect(() => {
    // A paused sandbox is shown as it is: connecting would resume it.
    api<Listed>(`/sandboxes/${encodeURIComponent(id)}`).then((info) => {
      setState(info.state)
      if (info.state === 'running') return connect(id).then(setSbx)
    }).catch((e) => setError(String(e)))
  }, [id])
  return (
    <section>
      <h2><a href="#/sandboxes">Sandboxes</a> / {id}</h2>
      {error && <p class="error" role="alert">{error}</p>}
      {state === 'paused' && <p>This sandbox is paused: resume it from the list to see its processes and files.</p>}
      <Metrics id={id} />
      {sbx && (
        <div class="columns">
          <div><h3>Processes</h3><Processes sbx={sbx} /></div>
          <div><h3>Files</h3><Files sbx={sbx} /></div>
        </div>
      )}
      <h3>Audit trail</h3>
      <Audit id={id} />
    </section>
  )
}
