// The volumes: each one's name and id; a volume's files, a directory at
// a time (#/volumes/ID), and a preview of a file as text. Everything a
// sandbox wrote there is shown as data: names and contents are text
// nodes, a symbolic link only its target.
import { useEffect, useState } from 'preact/hooks'
import { bytes, listVolumeDir, listVolumes, readVolumeFile, type Volume, type VolumeEntry } from './api'
import { usePoll } from './poll'

export function Volumes() {
  const [volumes, setVolumes] = useState<Volume[] | null>(null)
  const [error, setError] = useState('')
  usePoll((wanted) => listVolumes().then((v) => wanted() && setVolumes(v)).catch((e) => setError(String(e))), 3000, [])
  if (!volumes) return <p>{error || 'Loading…'}</p>
  return (
    <section>
      <h2>Volumes</h2>
      {volumes.length === 0 && <p>No volumes. The E2B SDK's <code>Volume.create(name)</code> makes one.</p>}
      <table class="volumes">
        <thead><tr><th>name</th><th>id</th></tr></thead>
        <tbody>
          {volumes.map((v) => (
            <tr data-volume={v.name}>
              <td><a href={`#/volumes/${encodeURIComponent(v.volumeID)}`}>{v.name}</a></td><td><code>{v.volumeID}</code></td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  )
}

const previewBytes = 64 << 10

export function VolumePage({ id }: { id: string }) {
  const [dir, setDir] = useState('/')
  const [entries, setEntries] = useState<VolumeEntry[] | null>(null)
  const [file, setFile] = useState<{ path: string; text: string; cut: boolean } | null>(null)
  const [error, setError] = useState('')
  useEffect(() => {
    setEntries(null)
    listVolumeDir(id, dir).then(setEntries).catch((e) => setError(String(e)))
  }, [id, dir])
  const open = (e: VolumeEntry) => {
    setError('')
    if (e.type === 'directory') {
      setFile(null)
      setDir(e.path)
    } else if (e.type === 'file') {
      readVolumeFile(id, e.path, previewBytes).then((r) => setFile({ path: e.path, ...r })).catch((err) => setError(String(err)))
    }
  }
  const up = dir === '/' ? null : dir.slice(0, dir.lastIndexOf('/')) || '/'
  return (
    <section>
      <h2><a href="#/volumes">Volumes</a> / <code>{id}</code></h2>
      <p class="path">{dir} {up && <button class="link" onClick={() => { setFile(null); setDir(up) }}>up</button>}</p>
      {error && <p class="error" role="alert">{error}</p>}
      {!entries ? <p>Loading…</p> : (
        <table class="entries">
          <thead><tr><th>name</th><th>type</th><th>size</th><th>mode</th><th>owner</th><th>modified</th></tr></thead>
          <tbody>
            {entries.map((e) => (
              <tr data-entry={e.name}>
                <td>{e.type === 'directory' || e.type === 'file' ? <button class="link" onClick={() => open(e)}>{e.name}</button> : e.name}
                  {e.type === 'symlink' && <span class="target"> → {e.target}</span>}</td>
                <td>{e.type}</td><td>{e.type === 'file' ? bytes(e.size) : ''}</td>
                <td><code>{e.mode.toString(8).padStart(4, '0')}</code></td><td>{e.uid}:{e.gid}</td><td>{e.mtime}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {file && (
        <div class="preview">
          <h3>{file.path}{file.cut && ` (its first ${bytes(previewBytes)})`}</h3>
          <pre>{file.text}</pre>
        </div>
      )}
    </section>
  )
}
