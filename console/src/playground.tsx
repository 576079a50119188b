// The playground: pick or create a code-interpreter sandbox, run cells in
// a language's context with their output streamed, or open a terminal in
// it (the SDK's PTY).
import { useEffect, useRef, useState } from 'preact/hooks'
import { Sandbox } from '@e2b/code-interpreter'
import { Terminal } from '@xterm/xterm'
import '@xterm/xterm/css/xterm.css'
import { listSandboxes, sdk, type Listed } from './api'
import { Output, type Item } from './output'

const languages = ['python', 'javascript', 'typescript', 'r', 'bash']

function Cells({ sbx }: { sbx: Sandbox }) {
  const [code, setCode] = useState('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])')
  const [language, setLanguage] = useState('python')
  const [items, setItems] = useState<Item[]>([])
  const [running, setRunning] = useState(false)
  const run = async () => {
    setRunning(true)
    const out: Item[] = []
    const push = (it: Item) => {
      out.push(it)
      setItems([...out])
    }
    try {
      const ex = await sbx.runCode(code, {
        language,
        onStdout: (m) => push({ kind: 'stdout', text: m.line }),
        onStderr: (m) => push({ kind: 'stderr', text: m.line }),
        onResult: (r) => push({ kind: 'result', result: r }),
        timeoutMs: 300_000,
      })
      if (ex.error) push({ kind: 'error', error: ex.error })
    } catch (err) {
      push({ kind: 'stderr', text: String(err) })
    } finally {
      setRunning(false)
    }
  }
  return (
    <div class="cells">
      <div class="row">
        <select aria-label="language" value={language} onChange={(e) => setLanguage((e.target as HTMLSelectElement).value)}>
          {languages.map((l) => <option value={l}>{l}</option>)}
        </select>
        <button id="run" disabled={running} onClick={run}>{running ? 'Running…' : 'Run'}</button>
      </div>
      <textarea id="code" aria-label="code" spellcheck={false} rows={8} value={code}
        onInput={(e) => setCode((e.target as HTMLTextAreaElement).value)}
        onKeyDown={(e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) run() }} />
      <Output items={items} />
    </div>
  )
}

function Term({ sbx }: { sbx: Sandbox }) {
  const ref = useRef<HTMLDivElement>(null)
  useEffect(() => {
    const term = new Terminal({ cols: 100, rows: 24, fontSize: 13 })
    term.open(ref.current!)
    const enc = new TextEncoder()
    let pid: number | undefined
    let closed = false
    // Keystrokes go one request at a time, in order (requests in flight
    // together may arrive in any order), and what is typed meanwhile, or
    // before the PTY exists, goes with the next.
    let pending = ''
    let sending = false
    const flush = async () => {
      if (sending || pid === undefined || !pending) return
      sending = true
      const data = pending
      pending = ''
      try {
        await sbx.pty.sendInput(pid, enc.encode(data))
      } finally {
        sending = false
        flush()
      }
    }
    sbx.pty.create({ cols: 100, rows: 24, timeoutMs: 0, onData: (d) => term.write(d) }).then((h) => {
      if (closed) return h.kill()
      pid = h.pid
      flush()
    }).catch((e) => term.write(`\r\n${e}\r\n`))
    const input = term.onData((d) => {
      pending += d
      flush()
    })
    term.focus()
    return () => {
      closed = true
      input.dispose()
      if (pid !== undefined) sbx.pty.kill(pid)
      term.dispose()
    }
  }, [sbx])
  return <div class="terminal" ref={ref} />
}

export function Playground() {
  const [list, setList] = useState<Listed[]>([])
  const [sbx, setSbx] = useState<Sandbox | null>(null)
  const [tab, setTab] = useState<'cells' | 'terminal'>('cells')
  const [error, setError] = useState('')
  const [creating, setCreating] = useState(false)
  useEffect(() => {
    listSandboxes().then((l) => setList(l.filter((s) => s.state === 'running'))).catch((e) => setError(String(e)))
  }, [sbx])
  const pick = async (id: string) => {
    setError('')
    try {
      setSbx(id ? await Sandbox.connect(id, sdk()) : null)
    } catch (e) {
      setError(String(e))
    }
  }
  const create = async () => {
    setCreating(true)
    setError('')
    try {
      setSbx(await Sandbox.create({ ...sdk(), metadata: { from: 'console' } }))
    } catch (e) {
      setError(String(e))
    } finally {
      setCreating(false)
    }
  }
  return (
    <section>
      <h2>Playground</h2>
      <div class="row">
        <select aria-label="sandbox" value={sbx?.sandboxId ?? ''} onChange={(e) => pick((e.target as HTMLSelectElement).value)}>
          <option value="">pick a sandbox…</option>
          {list.map((s) => <option value={s.sandboxID}>{s.sandboxID} ({s.templateID})</option>)}
        </select>
        <button id="create" disabled={creating} onClick={create}>{creating ? 'Creating…' : 'New code interpreter'}</button>
        {sbx && <span id="current">{sbx.sandboxId}</span>}
      </div>
      {error && <p class="error" role="alert">{error}</p>}
      {sbx && (
        <>
          <div class="tabs">
            <button class={tab === 'cells' ? 'on' : ''} onClick={() => setTab('cells')}>Cells</button>
            <button id="tab-terminal" class={tab === 'terminal' ? 'on' : ''} onClick={() => setTab('terminal')}>Terminal</button>
          </div>
          {tab === 'cells' ? <Cells sbx={sbx} /> : <Term sbx={sbx} />}
        </>
      )}
    </section>
  )
}
