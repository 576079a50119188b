// The console's one way to the server: the E2B SDKs and the REST API,
// with the API key the user typed, kept in this tab's sessionStorage only
// (never in a URL, never in localStorage).
import { Sandbox } from 'e2b'

const keyName = 'airlock-api-key'

export const session = {
  get key(): string {
    return sessionStorage.getItem(keyName) ?? ''
  },
  set(key: string) {
    sessionStorage.setItem(keyName, key)
  },
  clear() {
    sessionStorage.removeItem(keyName)
  },
}

// sdk are the SDKs' connection options: this server is both the API and
// the gateway.
export const sdk = () => ({ apiKey: session.key, apiUrl: location.origin, sandboxUrl: location.origin })

export class AuthError extends Error {}

// api calls the REST API with the key; a 401 means the key is wrong.
export async function api<T>(path: string, init: RequestInit = {}): Promise<T> {
  const res = await fetch(path, { ...init, headers: { 'X-API-KEY': session.key, 'Content-Type': 'application/json', ...(init.headers ?? {}) } })
  if (res.status === 401) throw new AuthError('the API key was refused')
  const text = await res.text()
  const body = text ? JSON.parse(text) : undefined
  if (!res.ok) throw new Error(body?.message ?? `${res.status} ${res.statusText}`)
  return body as T
}

// A sandbox as GET /v2/sandboxes lists it (E2B's fields, and Airlock's
// backend).
export interface Listed {
  sandboxID: string
  templateID: string
  startedAt: string
  endAt: string
  cpuCount: number
  memoryMB: number
  diskSizeMB: number
  metadata: Record<string, string> | null
  state: 'running' | 'paused'
  backend?: string
}

export interface Metric {
  timestampUnix: number
  cpuUsedPct: number
  cpuCount: number
  memUsed: number
  memTotal: number
  diskUsed: number
  diskTotal: number
}

export const listSandboxes = () => api<Listed[]>('/v2/sandboxes?state=running&state=paused&limit=1000')

export const metricsOf = (id: string, start?: Date) =>
  api<Metric[]>(`/sandboxes/${encodeURIComponent(id)}/metrics` + (start ? `?start=${Math.floor(start.getTime() / 1000)}&end=${Math.ceil(Date.now() / 1000)}` : ''))

export interface Pool {
  template: string
  size: number
  ready: number
  starting: number
  memoryBytes: number
}

export const listPools = () => api<{ pools: Pool[]; memoryBudgetBytes: number }>('/airlock/pools')

// Volumes (E2B's Volume): the list, and a volume's entries and files,
// which the content API serves to the API key as to the volume's token.
export interface Volume {
  volumeID: string
  name: string
}

export interface VolumeEntry {
  name: string
  type: 'file' | 'directory' | 'symlink' | 'unknown'
  path: string
  size: number
  mode: number
  uid: number
  gid: number
  mtime: string
  target?: string
}

export const listVolumes = () => api<Volume[]>('/volumes')

// A sandbox's audit trail (Airlock's own route): egress decisions and
// API actions, and the allowlist that covers what it reached.
export interface AuditEvent {
  time: string
  kind: string
  proto?: string
  name?: string
  addr?: string
  port?: number
  decision?: string
  rule?: string
  sent?: number
  received?: number
  status?: number
  actor?: string
  action?: string
  count?: number
}
export const auditOf = (id: string) => api<{ events: AuditEvent[] }>(`/sandboxes/${encodeURIComponent(id)}/audit`)
export const allowlistOf = (id: string) => api<{ allowOut: string[]; denied: string[] }>(`/sandboxes/${encodeURIComponent(id)}/audit/allowlist`)
export const listVolumeDir = (id: string, path: string) =>
  api<VolumeEntry[]>(`/volumecontent/${encodeURIComponent(id)}/dir?path=${encodeURIComponent(path)}`)

// readVolumeFile reads at most limit bytes of a file of volume id, as
// text: a preview, never the whole of a big file.
export async function readVolumeFile(id: string, path: string, limit: number): Promise<{ text: string; cut: boolean }> {
  const res = await fetch(`/volumecontent/${encodeURIComponent(id)}/file?path=${encodeURIComponent(path)}`, { headers: { 'X-API-KEY': session.key } })
  if (res.status === 401) throw new AuthError('the API key was refused')
  if (!res.ok) throw new Error((await res.json().catch(() => null))?.message ?? `${res.status} ${res.statusText}`)
  const reader = res.body!.getReader()
  const chunks: Uint8Array[] = []
  let n = 0
  while (n < limit) {
    const { value, done } = await reader.read()
    if (done) break
    chunks.push(value)
    n += value.length
  }
  const cut = n >= limit
  reader.cancel()
  const all = new Uint8Array(n)
  let off = 0
  for (const c of chunks) { all.set(c, off); off += c.length }
  return { text: new TextDecoder().decode(all.subarray(0, limit)), cut }
}

// Actions on one sandbox, as the SDK does them.
export const actions = {
  kill: (id: string) => Sandbox.kill(id, sdk()),
  extend: (id: string, ms: number) => Sandbox.setTimeout(id, ms, sdk()),
  pause: (id: string) => Sandbox.connect(id, sdk()).then((s) => s.pause()),
  resume: (id: string) => Sandbox.connect(id, sdk()),
}

export const connect = (id: string) => Sandbox.connect(id, sdk())

export function bytes(n: number): string {
  if (!Number.isFinite(n)) return '–'
  const units = ['B', 'KiB', 'MiB', 'GiB']
  let i = 0
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024
    i++
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`
}

export function duration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000))
  if (s < 60) return `${s}s`
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`
}
