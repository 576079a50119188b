// A cluster of Airlock nodes against a real Kubernetes control plane, with
// no kubelet: etcd and kube-apiserver (built from the Go module proxy by
// make controlplane, found in $AIRLOCK_CONTROLPLANE) on a bridge of the
// test's own; three airlock serve node daemons, each in a network
// namespace of its own standing for a host, that register through the
// real API with the identities and Roles of deploy/kubernetes; and an
// airlock router on loopback. No packet leaves the machine: the bridge
// has no uplink and the namespaces no default route.
import { spawn, execFileSync } from 'node:child_process'
import { generateKeyPairSync, randomBytes } from 'node:crypto'
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from 'node:fs'
import { request as httpsRequest } from 'node:https'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join, resolve, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseAllDocuments } from 'yaml'

const here = dirname(fileURLToPath(import.meta.url))
export const repo = resolve(here, '../..')
export const airlockBin = join(repo, 'bin/airlock')
export const manifests = join(repo, 'deploy/kubernetes')
export const namespace = 'airlock'

// Why the cluster cannot be built here, or null.
export function unavailable() {
  if (process.getuid() !== 0) return 'needs root (sandboxes, network namespaces)'
  const cp = process.env.AIRLOCK_CONTROLPLANE
  if (!cp || !existsSync(join(cp, 'etcd')) || !existsSync(join(cp, 'kube-apiserver'))) {
    return 'no control plane: run make controlplane and set AIRLOCK_CONTROLPLANE (make test-cluster does both)'
  }
  return null
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

function freePort(host = '127.0.0.1') {
  return new Promise((res, rej) => {
    const s = createServer()
    s.on('error', rej)
    s.listen(0, host, () => { const { port } = s.address(); s.close(() => res(port)) })
  })
}

const ip = (...args) => execFileSync('ip', args, { stdio: ['ignore', 'pipe', 'pipe'] }).toString()

// A /24 under 10.241/16 that no route of the host covers yet.
function freeSubnet() {
  const routes = ip('-4', 'route', 'show', 'table', 'all')
  for (let i = 0; i < 50; i++) {
    const x = 1 + Math.floor(Math.random() * 254)
    if (!routes.includes(`10.241.${x}.`)) return `10.241.${x}`
  }
  throw new Error('no free 10.241.x.0/24 for the test bridge')
}

// started runs a child with its output kept (shown if a test fails).
function started(cmd, args, opts = {}) {
  const p = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], ...opts })
  p.log = ''
  const keep = (d) => { p.log = (p.log + d).slice(-200_000) }
  p.stdout.on('data', keep)
  p.stderr.on('data', keep)
  p.exited = new Promise((r) => p.on('exit', (code, signal) => r({ code, signal })))
  return p
}

async function stop(p, signal = 'SIGTERM') {
  if (!p || p.exitCode !== null || p.signalCode !== null) return
  p.kill(signal)
  const t = setTimeout(() => p.kill('SIGKILL'), 20_000)
  await p.exited
  clearTimeout(t)
}

// The API server's REST API, as an identity with a bearer token.
export class Kube {
  constructor(server, token) { this.server = server; this.token = token }

  call(method, path, body, contentType = 'application/json') {
    const url = new URL(path, this.server)
    const data = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body)
    return new Promise((res, rej) => {
      const req = httpsRequest(url, {
        method, rejectUnauthorized: false, // the API server's own self-signed certificate
        headers: { Authorization: `Bearer ${this.token}`, Accept: 'application/json', ...(data !== undefined && { 'Content-Type': contentType }) },
      }, (resp) => {
        let text = ''
        resp.on('data', (d) => { text += d })
        resp.on('end', () => {
          let json = null
          try { json = JSON.parse(text) } catch {}
          res({ status: resp.statusCode, json, text })
        })
      })
      req.on('error', rej)
      req.setTimeout(30_000, () => req.destroy(new Error(`${method} ${path}: timed out`)))
      if (data !== undefined) req.write(data)
      req.end()
    })
  }

  // The REST path of an object, found through discovery as kubectl does.
  async pathOf(obj) {
    const [group, version] = obj.apiVersion.includes('/') ? obj.apiVersion.split('/') : ['', obj.apiVersion]
    const base = group ? `/apis/${group}/${version}` : `/api/${version}`
    this.discovery ??= new Map()
    if (!this.discovery.has(base)) {
      const r = await this.call('GET', base)
      if (r.status !== 200) throw new Error(`discovery of ${base}: ${r.status} ${r.text}`)
      this.discovery.set(base, r.json.resources)
    }
    const res = this.discovery.get(base).find((x) => x.kind === obj.kind && !x.name.includes('/'))
    if (!res) throw new Error(`the API server has no kind ${obj.kind} in ${obj.apiVersion}`)
    const ns = res.namespaced ? `/namespaces/${obj.metadata.namespace ?? 'default'}` : ''
    return `${base}${ns}/${res.name}/${obj.metadata.name}`
  }

  // apply is kubectl apply --server-side (with --dry-run=server if dryRun).
  async apply(obj, { dryRun = false } = {}) {
    const path = await this.pathOf(obj)
    const q = `?fieldManager=airlock-test&force=true${dryRun ? '&dryRun=All' : ''}`
    const r = await this.call('PATCH', path + q, JSON.stringify(obj), 'application/apply-patch+yaml')
    if (r.status !== 200 && r.status !== 201) {
      throw new Error(`apply ${obj.kind} ${obj.metadata.name}${dryRun ? ' (dry run)' : ''}: ${r.status} ${r.json?.message ?? r.text}`)
    }
    return r.json
  }
}

// The objects of a manifest file.
export function objectsOf(file) {
  return parseAllDocuments(readFileSync(file, 'utf8')).map((d) => d.toJS()).filter(Boolean)
}

// The files kustomization.yaml lists, in order.
export function kustomizationFiles() {
  const k = objectsOf(join(manifests, 'kustomization.yaml'))[0]
  return k.resources.map((f) => join(manifests, f))
}

function kubeconfig(file, server, token) {
  writeFileSync(file, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "${server}", insecure-skip-tls-verify: true}
users:
- name: test
  user: {token: "${token}"}
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`, { mode: 0o600 })
}

// startCluster builds it all; close() takes it all down again.
export async function startCluster({ nodes = 3, poolSize = 1 } = {}) {
  const cp = process.env.AIRLOCK_CONTROLPLANE
  const dir = mkdtempSync(join(tmpdir(), 'airlock-cluster-'))
  const tag = randomBytes(2).toString('hex')
  const net = freeSubnet()
  const bridge = `alk${tag}`
  const nsNames = []
  const procs = []
  const c = { dir, net, nodes: [], key: 'e2b_' + randomBytes(20).toString('hex') }
  const cleanup = async () => {
    for (const p of procs.reverse()) await stop(p)
    for (const n of nsNames) { try { ip('netns', 'del', n) } catch {} }
    try { ip('link', 'del', bridge) } catch {}
    rmSync(dir, { recursive: true, force: true })
  }
  c.close = cleanup
  try {
    // The "hosts": a bridge on this machine, a namespace per node.
    ip('link', 'add', bridge, 'type', 'bridge')
    ip('addr', 'add', `${net}.1/24`, 'dev', bridge)
    ip('link', 'set', bridge, 'up')
    for (let i = 1; i <= nodes; i++) {
      const ns = `alk${tag}-n${i}`
      ip('netns', 'add', ns)
      nsNames.push(ns)
      ip('link', 'add', `alk${tag}v${i}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns)
      ip('link', 'set', `alk${tag}v${i}`, 'master', bridge, 'up')
      ip('-n', ns, 'addr', 'add', `${net}.${10 + i}/24`, 'dev', 'eth0')
      ip('-n', ns, 'link', 'set', 'eth0', 'up')
      ip('-n', ns, 'link', 'set', 'lo', 'up')
    }

    // etcd, on loopback.
    const [client, peer] = [await freePort(), await freePort()]
    procs.push(started(join(cp, 'etcd'), [
      '--name', 'test', '--data-dir', join(dir, 'etcd'), '--log-level', 'warn',
      '--listen-client-urls', `http://127.0.0.1:${client}`, '--advertise-client-urls', `http://127.0.0.1:${client}`,
      '--listen-peer-urls', `http://127.0.0.1:${peer}`, '--initial-advertise-peer-urls', `http://127.0.0.1:${peer}`,
      '--initial-cluster', `test=http://127.0.0.1:${peer}`,
    ]))

    // kube-apiserver, on the bridge, where the nodes reach it.
    const { publicKey, privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 })
    writeFileSync(join(dir, 'sa.pub'), publicKey.export({ type: 'spki', format: 'pem' }))
    writeFileSync(join(dir, 'sa.key'), privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 })
    const admin = randomBytes(16).toString('hex')
    writeFileSync(join(dir, 'tokens.csv'), `${admin},admin,admin,system:masters\n`, { mode: 0o600 })
    const apiPort = await freePort(`${net}.1`)
    procs.push(c.apiserver = started(join(cp, 'kube-apiserver'), [
      '--etcd-servers', `http://127.0.0.1:${client}`,
      '--bind-address', `${net}.1`, '--advertise-address', `${net}.1`, '--secure-port', String(apiPort),
      '--cert-dir', join(dir, 'pki'), '--token-auth-file', join(dir, 'tokens.csv'),
      '--authorization-mode', 'RBAC', '--endpoint-reconciler-type', 'none',
      '--service-account-issuer', 'https://kubernetes.default.svc',
      '--service-account-key-file', join(dir, 'sa.pub'), '--service-account-signing-key-file', join(dir, 'sa.key'),
      '--service-cluster-ip-range', '10.96.0.0/24', '-v', '0',
      // As kubeadm's clusters do: the DaemonSet is privileged.
      '--allow-privileged=true',
    ]))
    c.server = `https://${net}.1:${apiPort}`
    c.kube = new Kube(c.server, admin)
    const t0 = Date.now()
    for (;;) {
      const r = await c.kube.call('GET', '/readyz').catch(() => null)
      if (r?.status === 200) break
      if (c.apiserver.exitCode !== null) throw new Error(`kube-apiserver exited:\n${c.apiserver.log.slice(-3000)}`)
      if (Date.now() - t0 > 120_000) throw new Error(`kube-apiserver not ready in 120 s:\n${c.apiserver.log.slice(-3000)}`)
      await sleep(250)
    }
    c.apiReadyMs = Date.now() - t0

    // What an operator applies first: the namespace, the CRDs, RBAC.
    for (const f of ['namespace.yaml', 'crds.yaml', 'rbac.yaml']) {
      for (const obj of objectsOf(join(manifests, f))) await c.kube.apply(obj)
    }
    for (const crd of objectsOf(join(manifests, 'crds.yaml'))) {
      for (let i = 0; ; i++) {
        const r = await c.kube.call('GET', `/apis/apiextensions.k8s.io/v1/customresourcedefinitions/${crd.metadata.name}`)
        if (r.json?.status?.conditions?.some((x) => x.type === 'Established' && x.status === 'True')) break
        if (i > 100) throw new Error(`CRD ${crd.metadata.name} not established`)
        await sleep(100)
      }
    }
    // The nodes and the router run as the ServiceAccounts of rbac.yaml:
    // what they may do is exactly what the manifests grant.
    const tokenOf = async (sa) => {
      const r = await c.kube.call('POST', `/api/v1/namespaces/${namespace}/serviceaccounts/${sa}/token`,
        { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 3600 } })
      if (r.status !== 201) throw new Error(`token of ${sa}: ${r.status} ${r.text}`)
      return r.json.status.token
    }
    kubeconfig(join(dir, 'node.kubeconfig'), c.server, await tokenOf('airlock-node'))
    kubeconfig(join(dir, 'router.kubeconfig'), c.server, await tokenOf('airlock-router'))

    // A registry on the bridge, for AirlockTemplates' images (tests/mkimage:
    // busybox:latest); the nodes may pull from this private address.
    // (It serves until its standard input ends: kept open, a pipe.)
    procs.push(c.registryProc = started(join(repo, 'bin/mkimage'), ['-listen', `${net}.1:0`], { stdio: ['pipe', 'pipe', 'pipe'] }))
    for (let k = 0; ; k++) {
      const m = c.registryProc.log.match(/REGISTRY=(\S+)/)
      if (m) { c.registry = m[1]; break }
      if (c.registryProc.exitCode !== null) throw new Error(`mkimage exited:\n${c.registryProc.log}`)
      if (k > 300) throw new Error('mkimage did not start in 30 s')
      await sleep(100)
    }
    writeFileSync(join(dir, 'node.json'), JSON.stringify({ builds: { privateRegistries: true } }))

    const env = { ...process.env, AIRLOCK_API_KEY: c.key }
    c.startNode = async (i) => {
      const n = c.nodes[i - 1] ?? { name: `node-${i}`, ns: `alk${tag}-n${i}`, addr: `${net}.${10 + i}:49982`, state: join(dir, `node-${i}`) }
      c.nodes[i - 1] = n
      n.url = `http://${n.addr}`
      // nsenter, not ip netns exec: that remounts /sys, hiding the cgroup
      // file systems the daemon makes sandboxes' cgroups in.
      n.proc = started('nsenter', [`--net=/run/netns/${n.ns}`, '--', airlockBin, 'serve',
        '--listen', n.addr, '--state-dir', n.state, '--pool-size', String(poolSize), '--config', join(dir, 'node.json'),
        '--node-name', n.name, '--kubeconfig', join(dir, 'node.kubeconfig'), '--namespace', namespace], { env })
      procs.push(n.proc)
      for (let k = 0; ; k++) {
        if (n.proc.log.includes('airlock node registered')) break
        if (n.proc.exitCode !== null) throw new Error(`${n.name} exited:\n${n.proc.log.slice(-3000)}`)
        if (k > 600) throw new Error(`${n.name} did not register in 60 s:\n${n.proc.log.slice(-3000)}`)
        await sleep(100)
      }
      return n
    }
    for (let i = 1; i <= nodes; i++) await c.startNode(i)

    procs.push(c.router = started(airlockBin, ['router', '--kubeconfig', join(dir, 'router.kubeconfig'),
      '--namespace', namespace, '--listen', '127.0.0.1:0'], { env }))
    for (let k = 0; ; k++) {
      const m = c.router.log.match(/E2B_API_URL=(\S+)/)
      if (m) { c.url = m[1]; break }
      if (c.router.exitCode !== null) throw new Error(`router exited:\n${c.router.log}`)
      if (k > 300) throw new Error(`router did not start in 30 s:\n${c.router.log}`)
      await sleep(100)
    }
    c.opts = { apiKey: c.key, apiUrl: c.url, sandboxUrl: c.url, requestTimeoutMs: 60_000 }
    return c
  } catch (e) {
    await cleanup()
    throw e
  }
}

// api calls Airlock's API at base (a router or a node) with the key.
export async function api(c, base, path, init = {}) {
  const r = await fetch(base + path, { ...init, headers: { 'X-API-KEY': c.key, 'Content-Type': 'application/json', ...init.headers } })
  const text = await r.text()
  let json = null
  try { json = JSON.parse(text) } catch {}
  return { status: r.status, json, text, headers: r.headers }
}

// The node (of c.nodes) that holds sandbox id, asked of every node.
export async function ownerOf(c, id) {
  const owners = []
  for (const n of c.nodes) {
    if (n.proc.exitCode !== null || n.proc.signalCode !== null) continue
    const r = await api(c, n.url, `/sandboxes/${id}`)
    if (r.status === 200) owners.push(n.name)
  }
  return owners
}

export { sleep, stop }
