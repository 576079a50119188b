// Airlock on many hosts: three node daemons and a router against a real
// Kubernetes API server (cluster-harness.mjs), driven through the real E2B
// SDKs. Run by make test-cluster (part of make test).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { request as httpRequest } from 'node:http'
import { Sandbox, Template, BuildError, Volume } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'
import { readdirSync, mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { tmpdir } from 'node:os'
import { unavailable, startCluster, kustomizationFiles, objectsOf, api, ownerOf, namespace, manifests, sleep, stop } from './cluster-harness.mjs'

const skip = unavailable() || false
let c
const created = [] // every sandbox the tests made, killed at the end

before(async () => {
  if (skip) return
  c = await startCluster({ nodes: 3, poolSize: 1 })
})

after(async () => {
  if (!c) return
  for (const sb of created) await sb.kill().catch(() => {})
  await c.close()
})

// Some output of every process, for a failing test.
function logs() {
  return [c.router, ...c.nodes.map((n) => n.proc)].map((p) => p.log.slice(-1500)).join('\n----\n')
}

test('the manifests pass server-side dry run against the API server', { skip }, async () => {
  let n = 0
  // The kustomization's files in its order, then the examples beside it.
  const files = kustomizationFiles()
  for (const f of readdirSync(manifests)) {
    if (f.endsWith('.yaml') && f !== 'kustomization.yaml' && !files.includes(join(manifests, f))) files.push(join(manifests, f))
  }
  for (const f of files) {
    for (const obj of objectsOf(f)) {
      await c.kube.apply(obj, { dryRun: true })
      n++
    }
  }
  assert.ok(n >= 14, `only ${n} objects in the manifests`)
  // Validation of the CRDs holds: a pool of a negative size is refused.
  await assert.rejects(c.kube.apply({
    apiVersion: 'airlock-sandbox.github.io/v1alpha1', kind: 'AirlockPool',
    metadata: { name: 'bad', namespace }, spec: { template: 'base', size: -1 },
  }, { dryRun: true }), /size/)
  // A node's address is one that the routers can parse (they check it
  // again, and leave out a node whose address they cannot).
  const nodeAt = (address) => ({
    apiVersion: 'airlock-sandbox.github.io/v1alpha1', kind: 'AirlockNode',
    metadata: { name: 'addr', namespace }, spec: { address, idPrefix: 'abcdef' },
  })
  for (const good of ['http://10.0.0.5:49982', 'https://node-1.airlock.svc/', 'http://[fd00::5]:8080']) {
    await c.kube.apply(nodeAt(good), { dryRun: true })
  }
  for (const bad of ['http://[::1', 'http://host:port', 'http://%zz', 'http://host:99999', 'http://[zz::1]:80',
    'http://user@host', 'http://host?x', 'http://host:0']) {
    await assert.rejects(c.kube.apply(nodeAt(bad), { dryRun: true }), /address/, `the CRD took the address ${JSON.stringify(bad)}`)
  }
})

test('nodes register through the API: each has a Lease and an AirlockNode', { skip }, async () => {
  const r = await c.kube.call('GET', `/apis/airlock-sandbox.github.io/v1alpha1/namespaces/${namespace}/airlocknodes`)
  assert.equal(r.status, 200)
  assert.deepEqual(r.json.items.map((x) => x.metadata.name).sort(), ['node-1', 'node-2', 'node-3'])
  for (const item of r.json.items) {
    assert.match(item.spec.idPrefix, /^[0-9a-f]{6}$/)
    assert.equal(item.spec.address, c.nodes.find((n) => n.name === item.metadata.name).url)
    const lease = await c.kube.call('GET', `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases/${item.metadata.name}`)
    assert.equal(lease.status, 200)
    assert.equal(lease.json.spec.holderIdentity, item.metadata.name)
  }
  // The router sees them all.
  const seen = await api(c, c.url, '/airlock/nodes')
  assert.equal(seen.json.length, 3, logs())
})

test('creates spread over the nodes; commands, files and code reach the right node; list sees all', { skip }, async () => {
  const boxes = []
  for (let i = 0; i < 6; i++) {
    const sb = await Sandbox.create('base', { ...c.opts, metadata: { run: 'spread', i: String(i) } })
    created.push(sb)
    boxes.push(sb)
  }
  const byNode = {}
  for (const sb of boxes) {
    const owners = await ownerOf(c, sb.sandboxId)
    assert.equal(owners.length, 1, `${sb.sandboxId} is on ${owners.length} nodes`)
    byNode[owners[0]] = (byNode[owners[0]] ?? 0) + 1
    // The sandbox's own traffic goes to its node: a file written through
    // the router is read back by a command through the router.
    await sb.files.write('/tmp/whoami', sb.sandboxId)
    const r = await sb.commands.run('cat /tmp/whoami; echo; hostname')
    assert.equal(r.stdout.split('\n')[0], sb.sandboxId)
  }
  assert.deepEqual(Object.keys(byNode).sort(), ['node-1', 'node-2', 'node-3'], `creates landed ${JSON.stringify(byNode)}`)

  // Code, through the code interpreter's port on the sandbox's node.
  const ci = await CodeSandbox.create({ ...c.opts })
  created.push(ci)
  const exec = await ci.runCode('x = 20\nx * 2 + 2')
  assert.equal(exec.text, '42')
  assert.equal((await ci.runCode('x + 1')).text, '21')

  // list fans out: every sandbox, once, newest first; pages of two walk
  // the whole cluster without repeats.
  const want = [...boxes, ci].map((sb) => sb.sandboxId).sort()
  const all = await Sandbox.list({ ...c.opts }).nextItems()
  assert.deepEqual(all.map((x) => x.sandboxId).filter((id) => want.includes(id)).sort(), want)
  const paged = []
  const pager = Sandbox.list({ ...c.opts, limit: 2 })
  while (pager.hasNext) paged.push(...(await pager.nextItems()).map((x) => x.sandboxId))
  assert.equal(new Set(paged).size, paged.length, 'a page repeated a sandbox')
  assert.deepEqual(paged.filter((id) => want.includes(id)).sort(), want)
  const filtered = await Sandbox.list({ ...c.opts, query: { metadata: { run: 'spread', i: '3' } } }).nextItems()
  assert.deepEqual(filtered.map((x) => x.sandboxId), [boxes[3].sandboxId])

  // Signed file URLs name no sandbox: the router finds the node whose
  // sandbox signed them, and a tampered one opens nothing anywhere.
  const sb1 = boxes[1]
  const url = await sb1.downloadUrl('/tmp/whoami', { useSignatureExpiration: 60 })
  assert.ok(url.startsWith(c.url), url)
  let r = await fetch(url)
  assert.equal(r.status, 200)
  assert.equal(await r.text(), sb1.sandboxId)
  const tampered = new URL(url)
  tampered.searchParams.set('path', '/etc/passwd')
  assert.equal((await fetch(tampered)).status, 401)
  const up = await sb1.uploadUrl('/tmp/up.txt', { useSignatureExpiration: 60 })
  const form = new FormData()
  form.append('file', new Blob(['through the router']), 'up.txt')
  r = await fetch(up, { method: 'POST', body: form })
  assert.equal(r.status, 200, await r.text())
  assert.equal(await sb1.files.read('/tmp/up.txt'), 'through the router')

  // A sandbox's own server, by host name (getHost), through the router.
  const host = sb1.getHost(8080)
  assert.equal(host, `8080-${sb1.sandboxId}.localhost:${new URL(c.url).port}`)
  await sb1.commands.run('cd /tmp && exec python3 -m http.server 8080 --bind 127.0.0.1', { background: true })
  let page
  for (let i = 0; ; i++) {
    page = await viaHost(c.url, host, '/whoami').catch((e) => ({ status: 0, body: String(e) }))
    if (page.status === 200) break
    if (i > 100) assert.fail(`the sandbox's server, by host name: ${page.status} ${page.body}`)
    await sleep(100)
  }
  assert.equal(page.body, sb1.sandboxId)
})

// viaHost GETs path from the router at base with the Host header host.
function viaHost(base, host, path) {
  const u = new URL(base)
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: u.hostname, port: u.port, path, headers: { Host: host } }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('a volume lives on one node: its files through the router by its token, a sandbox that mounts it lands there', { skip }, async () => {
  process.env.E2B_VOLUME_API_URL = c.url // where the SDK sends a volume's files
  const vol = await Volume.create('shared', c.opts)
  await vol.writeFile('/hello.txt', 'from outside')
  assert.ok((await Volume.list(c.opts)).some((v) => v.name === 'shared'))
  await assert.rejects(Volume.create('shared', c.opts), /already exists/)
  const sb = await Sandbox.create('base', { ...c.opts, volumeMounts: { '/mnt/v': 'shared' } })
  created.push(sb)
  assert.equal((await sb.commands.run('cat /mnt/v/hello.txt')).stdout, 'from outside')
  assert.equal(sb.sandboxId.slice(1, 7), vol.volumeId.slice(0, 6), 'the sandbox is on its volume\'s node')
  await sb.kill()
  assert.equal(await Volume.destroy(vol.volumeId, c.opts), true)
})

test('a pool size set with an AirlockPool takes effect on every node, and goes back when removed', { skip }, async () => {
  const pool = {
    apiVersion: 'airlock-sandbox.github.io/v1alpha1', kind: 'AirlockPool',
    metadata: { name: 'base-pool', namespace }, spec: { template: 'base', size: 3 },
  }
  const sizes = async () => Promise.all(c.nodes.map(async (n) => {
    const r = await api(c, n.url, '/airlock/pools')
    const p = r.json.pools.find((x) => x.template === 'base')
    return p && { size: p.size, ready: p.ready }
  }))
  const waitFor = async (pred, what) => {
    for (let i = 0; ; i++) {
      const s = await sizes()
      if (s.every(pred)) return s
      if (i > 240) assert.fail(`${what}: pools ${JSON.stringify(s)}\n${logs()}`)
      await sleep(250)
    }
  }
  await c.kube.apply(pool)
  await waitFor((p) => p?.size === 3 && p.ready === 3, 'size 3 on every node')
  // Through the router too: its pools list names each node.
  const r = await api(c, c.url, '/airlock/pools')
  assert.deepEqual(r.json.pools.filter((p) => p.template === 'base').map((p) => p.node).sort(), ['node-1', 'node-2', 'node-3'])

  const del = await c.kube.call('DELETE', `/apis/airlock-sandbox.github.io/v1alpha1/namespaces/${namespace}/airlockpools/base-pool`)
  assert.equal(del.status, 200)
  await waitFor((p) => p?.size === 1 && p.ready === 1, 'back to the configured size 1')
})

test('a template declared with an AirlockTemplate is built on every node, and removed with it', { skip }, async () => {
  const tmpl = {
    apiVersion: 'airlock-sandbox.github.io/v1alpha1', kind: 'AirlockTemplate',
    metadata: { name: 'hello', namespace },
    spec: { fromImage: `${c.registry}/busybox:latest`, steps: [{ type: 'RUN', args: ['echo built by the cluster > /srv/hello', 'root'] }] },
  }
  // The CRD refuses a template with two bases.
  await assert.rejects(c.kube.apply({ ...tmpl, spec: { ...tmpl.spec, fromTemplate: 'base' } }, { dryRun: true }), /exactly one of fromImage and fromTemplate/)
  await c.kube.apply(tmpl)
  const phases = async () => {
    const r = await c.kube.call('GET', `/apis/airlock-sandbox.github.io/v1alpha1/namespaces/${namespace}/airlocknodes`)
    return r.json.items.map((n) => [n.metadata.name, n.status?.templates?.find((t) => t.name === 'hello')])
  }
  for (let i = 0; ; i++) {
    const p = await phases()
    if (p.length === 3 && p.every(([, t]) => t?.phase === 'ready')) break
    if (p.some(([, t]) => t?.phase === 'error')) assert.fail(`a build failed: ${JSON.stringify(p)}`)
    if (i > 600) assert.fail(`not built on every node in 120 s: ${JSON.stringify(p)}\n${logs()}`)
    await sleep(200)
  }
  // Sandboxes of it through the router (placed where one is ready), and
  // straight from each node: every node has it.
  for (let i = 0; i < 3; i++) {
    const sb = await Sandbox.create('hello', { ...c.opts })
    created.push(sb)
    assert.equal((await sb.commands.run('cat /srv/hello')).stdout, 'built by the cluster\n')
    await sb.kill()
  }
  for (const n of c.nodes) {
    const sb = await Sandbox.create('hello', { ...c.opts, apiUrl: n.url, sandboxUrl: n.url })
    created.push(sb)
    assert.equal((await sb.commands.run('cat /srv/hello')).stdout, 'built by the cluster\n', n.name)
    await sb.kill()
  }

  // A second object that makes the same template name (hello:default is
  // hello) is not built: the older one stays, built once on each node, and
  // the newer one says why in its status.
  const builds = () => c.nodes.map((n) => n.proc.log.split('template from AirlockTemplate" template=hello ').length - 1)
  const before = builds()
  const rival = { ...tmpl, metadata: { name: 'hello-rival', namespace }, spec: { ...tmpl.spec, name: 'hello:default', startCmd: 'sleep 1' } }
  await c.kube.apply(rival)
  const rivalPath = `/apis/airlock-sandbox.github.io/v1alpha1/namespaces/${namespace}/airlocktemplates/hello-rival`
  for (let i = 0; ; i++) {
    const r = await c.kube.call('GET', rivalPath)
    const cond = r.json?.status?.conditions?.find((x) => x.type === 'NameConflict')
    if (cond) {
      assert.equal(cond.status, 'True')
      assert.match(cond.message, /AirlockTemplate "hello", which is older, makes template "hello" too/)
      break
    }
    if (i > 150) assert.fail(`no NameConflict on the rival: ${JSON.stringify(r.json?.status)}\n${logs()}`)
    await sleep(200)
  }
  await sleep(3000) // three of the nodes' looks, each of which once started the build anew
  assert.deepEqual(builds(), before, 'a node built hello again while two objects named it')
  assert.ok((await phases()).every(([, t]) => t?.phase === 'ready'), JSON.stringify(await phases()))
  assert.equal((await c.kube.call('DELETE', rivalPath)).status, 200)

  const del = await c.kube.call('DELETE', `/apis/airlock-sandbox.github.io/v1alpha1/namespaces/${namespace}/airlocktemplates/hello`)
  assert.equal(del.status, 200)
  for (let i = 0; ; i++) {
    const p = await phases()
    const r = await api(c, c.url, '/sandboxes', { method: 'POST', body: JSON.stringify({ templateID: 'hello' }) })
    if (p.every(([, t]) => !t) && r.status === 400) {
      assert.match(r.json.message, /hello/)
      break
    }
    if (r.status === 201) created.push({ kill: () => api(c, c.url, `/sandboxes/${r.json.sandboxID}`, { method: 'DELETE' }) })
    if (i > 300) assert.fail(`the template outlived its AirlockTemplate: ${JSON.stringify(p)} ${r.status}`)
    await sleep(200)
  }
})

test('the SDK\'s Template builder through the router: built on every node, with files, logs and tags', { skip }, async () => {
  const context = mkdtempSync(join(tmpdir(), 'airlock-cluster-template-'))
  try {
    writeFileSync(join(context, 'notes.txt'), 'copied through the router\n')
    const buildLog = []
    const t = Template({ fileContextPath: context }).fromImage(`${c.registry}/busybox:latest`)
      .copy('notes.txt', '/opt/notes.txt')
      .runCmd('echo "built: $(cat /opt/notes.txt)"', { user: 'root' })
    const info = await Template.build(t, 'routed', { ...c.opts, onBuildLogs: (e) => buildLog.push(e.message), cpuCount: 1, memoryMB: 256 })
    assert.equal(info.templateId, 'routed')
    assert.ok(buildLog.some((l) => l.includes('built: copied through the router')), `a node's log of the build:\n${buildLog.join('\n')}`)
    // Its AirlockTemplate, which a node that joins later builds too.
    const objs = await c.kube.call('GET', `/apis/airlock-sandbox.github.io/v1alpha1/namespaces/${namespace}/airlocktemplates`)
    const obj = objs.json.items.find((o) => o.spec.name === 'routed')
    assert.equal(obj?.spec.steps?.[0]?.type, 'COPY', JSON.stringify(objs.json.items.map((o) => o.spec)))
    // Every node has it, and its files.
    for (const n of c.nodes) {
      const sb = await Sandbox.create('routed', { ...c.opts, apiUrl: n.url, sandboxUrl: n.url })
      created.push(sb)
      assert.equal(await sb.files.read('/opt/notes.txt'), 'copied through the router\n', n.name)
      await sb.kill()
    }
    assert.equal(await Template.exists('routed', c.opts), true)
    const list = await api(c, c.url, '/templates')
    assert.ok(list.json.some((x) => x.templateID === 'routed') && list.json.some((x) => x.templateID === 'base'), JSON.stringify(list.json))

    // A tag is a template of its own on every node; it goes when removed.
    await Template.assignTags('routed', ['stable'], c.opts)
    for (let i = 0; ; i++) {
      const r = await api(c, c.url, '/sandboxes', { method: 'POST', body: JSON.stringify({ templateID: 'routed:stable' }) })
      if (r.status === 201) {
        created.push({ kill: () => api(c, c.url, `/sandboxes/${r.json.sandboxID}`, { method: 'DELETE' }) })
        break
      }
      if (i > 300) assert.fail(`routed:stable not built in 60 s: ${r.status} ${r.text}\n${logs()}`)
      await sleep(200)
    }
    await Template.removeTags('routed', ['stable'], c.opts)

    // A failing step fails the build, with the node's reason.
    const failing = Template().fromImage(`${c.registry}/busybox:latest`).runCmd('echo no; exit 3', { user: 'root' })
    await assert.rejects(Template.build(failing, 'routed-fails', c.opts), (e) => e instanceof BuildError && /node node-\d: .*exit/i.test(e.message))

    // Deleted: the AirlockTemplates go, and every node removes the template.
    for (const name of ['routed', 'routed-fails']) {
      const del = await api(c, c.url, `/templates/${name}`, { method: 'DELETE' })
      assert.equal(del.status, 204, `${name}: ${del.text}`)
    }
    for (let i = 0; ; i++) {
      const gone = await Promise.all(c.nodes.map(async (n) => (await api(c, n.url, '/templates/aliases/routed')).status === 404))
      if (gone.every(Boolean)) break
      if (i > 300) assert.fail(`routed outlived its delete: ${gone}`)
      await sleep(200)
    }
  } finally {
    rmSync(context, { recursive: true, force: true })
  }
})

test('a node that dies takes its sandboxes with it: 404 within seconds, the others keep working', { skip }, async () => {
  const boxes = []
  for (let i = 0; i < 6; i++) {
    const sb = await Sandbox.create('base', { ...c.opts })
    created.push(sb)
    boxes.push({ sb, node: (await ownerOf(c, sb.sandboxId))[0] })
  }
  const victim = c.nodes.find((n) => boxes.some((b) => b.node === n.name))
  const gone = boxes.filter((b) => b.node === victim.name)
  const kept = boxes.filter((b) => b.node !== victim.name)
  assert.ok(gone.length > 0 && kept.length > 0, `placed: ${JSON.stringify(boxes.map((b) => b.node))}, nodes: ${JSON.stringify((await api(c, c.url, "/airlock/nodes")).json)}`)

  const t0 = Date.now()
  victim.proc.kill('SIGKILL')
  await victim.proc.exited
  // Its sandboxes are not found, fast: never a hang.
  for (const { sb } of gone) {
    const start = Date.now()
    await assert.rejects(sb.commands.run('true'), (e) => /not found|404/i.test(String(e)), `${sb.sandboxId} still answers`)
    assert.ok(Date.now() - start < 15_000, `a request to a dead node's sandbox took ${Date.now() - start} ms`)
    const info = await api(c, c.url, `/sandboxes/${sb.sandboxId}`)
    assert.equal(info.status, 404)
  }
  // The router stops listing it once its lease runs out.
  for (let i = 0; ; i++) {
    const live = await api(c, c.url, '/airlock/nodes')
    if (!live.json.some((n) => n.name === victim.name)) break
    if (i > 200) assert.fail(`${victim.name} still live after 20 s`)
    await sleep(100)
  }
  const deadIn = Date.now() - t0
  // The rest of the cluster works on: old sandboxes and new creates.
  for (const { sb } of kept) assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n')
  const fresh = await Sandbox.create('base', { ...c.opts })
  created.push(fresh)
  assert.notEqual((await ownerOf(c, fresh.sandboxId))[0], victim.name)
  console.log(`# ${victim.name} killed: its sandboxes answered 404 at once, and it left the router's live nodes after ${deadIn} ms`)

  // Restarted on its state directory, it removes what the killed daemon
  // left and rejoins; its old sandboxes stay gone.
  await c.startNode(c.nodes.indexOf(victim) + 1)
  for (let i = 0; ; i++) {
    const live = await api(c, c.url, '/airlock/nodes')
    if (live.json.some((n) => n.name === victim.name)) break
    if (i > 200) assert.fail(`${victim.name} did not rejoin in 20 s\n${logs()}`)
    await sleep(100)
  }
  assert.equal((await api(c, c.url, `/sandboxes/${gone[0].sb.sandboxId}`)).status, 404)
})

test('the router refuses what it cannot route, and bad keys', { skip }, async () => {
  assert.equal((await api(c, c.url, '/sandboxes', { headers: { 'X-API-KEY': 'wrong' } })).status, 401)
  const mcp = await api(c, c.url, '/mcp', { method: 'POST', body: '{}' })
  assert.equal(mcp.status, 501)
  assert.match(mcp.json.message, /MCP sessions/)
  // An id that names no node.
  assert.equal((await api(c, c.url, '/sandboxes/iffffff0000000000000')).status, 404)
  assert.equal((await api(c, c.url, '/sandboxes/not-an-id')).status, 404)
})

test('a node that stops deregisters: its Lease and AirlockNode are gone', { skip }, async () => {
  const n = c.nodes[2]
  await stop(n.proc)
  const lease = await c.kube.call('GET', `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases/${n.name}`)
  assert.equal(lease.status, 404)
  const node = await c.kube.call('GET', `/apis/airlock-sandbox.github.io/v1alpha1/namespaces/${namespace}/airlocknodes/${n.name}`)
  assert.equal(node.status, 404)
})
