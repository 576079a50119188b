// Drives Airlock's MCP server with the official MCP TypeScript client:
// over streamable HTTP from `airlock serve`, and over stdio from
// `airlock mcp`, as agents' hosts start it.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync, readdirSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { startServer, sleep } from './harness.mjs'

let server
before(async () => { server = await startServer(['--pool-size', '1']) })
after(async () => {
  const res = await server.stop()
  assert.deepEqual(res.leftover, [], 'sandboxes left behind')
})

async function httpClient() {
  const client = new Client({ name: 'airlock-test', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(server.env.E2B_API_URL + '/mcp'), {
    requestInit: { headers: { Authorization: `Bearer ${server.apiKey}` } },
  })
  await client.connect(transport)
  return { client, transport }
}

const text = (res) => res.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n')

async function mcpSandboxes() {
  const res = await fetch(server.env.E2B_API_URL + '/v2/sandboxes', { headers: { 'X-API-KEY': server.apiKey } })
  return (await res.json()).filter((s) => s.metadata?.['mcp-session'] !== undefined)
}

test('MCP over HTTP: tools, state, charts, commands, files', async () => {
  const { client, transport } = await httpClient()
  try {
    const tools = (await client.listTools()).tools
    assert.deepEqual(tools.map((t) => t.name).sort(), ['create_sandbox', 'kill_sandbox', 'list_files', 'list_sandboxes',
      'read_file', 'run_code', 'run_command', 'write_file'])
    const runCode = tools.find((t) => t.name === 'run_code')
    assert.deepEqual(runCode.inputSchema.required, ['code'])
    assert.equal(runCode.inputSchema.properties.code.type, 'string')
    assert.ok(runCode.inputSchema.properties.context_id && runCode.description.includes('images'))
    const runCommand = tools.find((t) => t.name === 'run_command')
    assert.equal(runCommand.inputSchema.properties.timeout_seconds.type, 'integer')
    assert.equal(runCommand.inputSchema.properties.background.type, 'boolean')

    await client.callTool({ name: 'run_code', arguments: { code: 'x = 21' } })
    let res = await client.callTool({ name: 'run_code', arguments: { code: 'print("hi"); x * 2' } })
    assert.equal(res.isError, undefined)
    assert.match(text(res), /stdout:\nhi/)
    assert.match(text(res), /^42$/m)

    res = await client.callTool({ name: 'run_code', arguments: {
      code: 'import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()' } })
    const img = res.content.find((c) => c.type === 'image')
    assert.ok(img, 'a chart comes back as an image: ' + JSON.stringify(res.content).slice(0, 300))
    assert.equal(img.mimeType, 'image/png')
    assert.equal(Buffer.from(img.data, 'base64').subarray(1, 4).toString(), 'PNG')

    res = await client.callTool({ name: 'run_code', arguments: { code: 'print("y" * 200000)' } })
    const t = text(res)
    assert.ok(t.length < 70000 && /output truncated: 65536 of 2000\d\d bytes shown/.test(t), t.slice(-200))

    // A long cell's output arrives as progress notifications before its result.
    const progress = []
    res = await client.callTool({ name: 'run_code', arguments: {
      code: 'import time\nfor i in range(4):\n    print("tick", i, flush=True)\n    time.sleep(0.4)' } },
    undefined, { onprogress: (p) => progress.push(p) })
    assert.match(text(res), /tick 3/)
    assert.ok(progress.length >= 2, `progress notifications: ${JSON.stringify(progress)}`)
    // The kernel may send "tick" and " 0" as separate stream messages, and
    // the first one goes out at once: the notifications, joined, are the output.
    assert.match(progress.map((p) => p.message).join(''), /^tick 0\ntick 1/)
    assert.ok(progress[1].progress > progress[0].progress)

    res = await client.callTool({ name: 'run_code', arguments: { code: '1 / 0' } })
    assert.equal(res.isError, true)
    assert.match(text(res), /ZeroDivisionError/)

    res = await client.callTool({ name: 'run_code', arguments: {
      code: 'import time\nprint("started", flush=True)\ntime.sleep(60)', timeout_seconds: 1 } })
    assert.equal(res.isError, true)
    assert.match(text(res), /started[\s\S]*did not finish within 1s and was interrupted/)
    res = await client.callTool({ name: 'run_code', arguments: { code: 'x + 1' } }) // x = 21 from the first cell
    assert.equal(text(res), '22', 'the kernel survives the interrupt with its state')

    res = await client.callTool({ name: 'run_command', arguments: { command: 'id -u; echo oops >&2; exit 3' } })
    assert.equal(res.isError, true)
    assert.match(text(res), /exit code 3\nstdout:\n1000\n\nstderr:\noops/)

    // MCP gives no network, whatever the E2B API's default (the internet,
    // where the server gives networks, as in tests/netlab): loopback only.
    res = await client.callTool({ name: 'run_command', arguments: { command: 'cat /proc/net/dev' } })
    assert.match(text(res), /\blo:/)
    assert.doesNotMatch(text(res), /eth0/, 'an MCP sandbox has an interface')

    // A foreground command is killed at its timeout; a background one lives on.
    res = await client.callTool({ name: 'run_command', arguments: { command: 'exec sleep 30', timeout_seconds: 1 } })
    assert.equal(res.isError, true)
    assert.match(text(res), /did not finish within 1s/)
    res = await client.callTool({ name: 'run_command', arguments: { command: 'exec sleep 31', background: true } })
    const pid = /pid (\d+)/.exec(text(res))?.[1]
    assert.ok(pid, text(res))
    await sleep(1500)
    res = await client.callTool({ name: 'run_command', arguments: { command: `cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -o 'sleep 3[01]' | sort` } })
    assert.match(text(res), /stdout:\nsleep 31\n\n/, 'the timed-out command is gone, the background one runs')

    res = await client.callTool({ name: 'write_file', arguments: { path: 'notes/a.txt', content: 'hello airlock' } })
    assert.match(text(res), /wrote 13 bytes/)
    res = await client.callTool({ name: 'read_file', arguments: { path: '/home/user/notes/a.txt' } })
    assert.equal(text(res), 'hello airlock')
    res = await client.callTool({ name: 'list_files', arguments: { path: 'notes' } })
    assert.match(text(res), /file\t13\t\/home\/user\/notes\/a.txt/)
    await client.callTool({ name: 'run_code', arguments: {
      code: 'plt.figure(figsize=(2, 2)); plt.plot([1, 2]); plt.savefig("chart.png")\nopen("blob.bin", "wb").write(bytes(range(256)))' } })
    res = await client.callTool({ name: 'read_file', arguments: { path: 'chart.png' } })
    assert.equal(res.content[0].type, 'image', 'a saved chart comes back as an image')
    assert.equal(res.content[0].mimeType, 'image/png')
    res = await client.callTool({ name: 'read_file', arguments: { path: 'blob.bin' } })
    assert.match(text(res), /blob.bin is a binary file \(application\/octet-stream\): not shown/)

    res = await client.callTool({ name: 'read_file', arguments: { path: '/no/such/file' } })
    assert.equal(res.isError, true)
    assert.doesNotMatch(text(res), /airlock-e2b-test|\/var\/lib/, 'no host paths in errors')

    res = await client.callTool({ name: 'create_sandbox', arguments: { template: 'nope' } })
    assert.equal(res.isError, true)
    assert.match(text(res), /nope/)
  } finally {
    await transport.terminateSession()
    await client.close()
  }
  // Ending the session ends its sandbox.
  for (let i = 0; i < 50 && (await mcpSandboxes()).length > 0; i++) await sleep(100)
  assert.deepEqual(await mcpSandboxes(), [])
})

test('MCP sessions have sandboxes of their own', async () => {
  const a = await httpClient()
  const b = await httpClient()
  try {
    await a.client.callTool({ name: 'run_code', arguments: { code: 'secret = "a"' } })
    const res = await b.client.callTool({ name: 'run_code', arguments: { code: 'secret' } })
    assert.equal(res.isError, true)
    assert.match(text(res), /NameError/)
    const listed = await a.client.callTool({ name: 'list_sandboxes', arguments: {} })
    const ids = (await mcpSandboxes()).map((s) => s.sandboxID)
    assert.equal(ids.length, 2)
    assert.ok(ids.includes(text(listed).split('\t')[0]), text(listed))
    const killed = await b.client.callTool({ name: 'kill_sandbox', arguments: {} })
    assert.match(text(killed), /killed/)
    assert.equal((await mcpSandboxes()).length, 1)
  } finally {
    for (const c of [a, b]) { await c.transport.terminateSession(); await c.client.close() }
  }
})

test('MCP create_sandbox: limits below the template\'s are enforced, above it refused', async () => {
  const { client, transport } = await httpClient()
  try {
    let res = await client.callTool({ name: 'create_sandbox', arguments: { memory_mb: 1 << 20 } })
    assert.equal(res.isError, true)
    assert.match(text(res), /memory 1T is above the template's 512M/)
    res = await client.callTool({ name: 'create_sandbox', arguments: { pids: 2 } })
    assert.equal(res.isError, true)
    assert.match(text(res), /pids 2 is below 32/)
    assert.deepEqual(await mcpSandboxes(), [], 'a refused request starts nothing')

    res = await client.callTool({ name: 'create_sandbox', arguments: { template: 'base', memory_mb: 128, cpus: 0.5 } })
    assert.equal(res.isError, undefined, text(res))
    res = await client.callTool({ name: 'list_sandboxes', arguments: {} })
    assert.match(text(res), /memory 128 MiB, 0.5 CPUs/)
    const first = text(res).split('\t')[0]
    // 300 MiB fits the template's 512 MiB, not this sandbox's 128.
    res = await client.callTool({ name: 'run_command', arguments: {
      command: 'python3 -c "x = bytearray(300 << 20); print(\'allocated\')"' } })
    assert.equal(res.isError, true)
    assert.doesNotMatch(text(res), /allocated/)
    if (process.env.AIRLOCK_TEST_BACKEND === 'gvisor') {
      // The limit is on the whole gVisor sandbox: the host kills it.
      assert.match(text(res), /the sandbox ended under it .* memory limit/, text(res))
    } else {
      assert.match(text(res), /exit code -1 \(signal: killed; the sandbox's memory limit/, text(res))
    }
    res = await client.callTool({ name: 'run_command', arguments: { command: 'echo still usable' } })
    assert.match(text(res), /still usable/)
    res = await client.callTool({ name: 'list_sandboxes', arguments: {} })
    assert.match(text(res), /memory 128 MiB, 0.5 CPUs/, 'a replacement keeps the limits asked for')
    assert.equal(text(res).split('\t')[0] === first, process.env.AIRLOCK_TEST_BACKEND !== 'gvisor')
  } finally {
    await transport.terminateSession()
    await client.close()
  }
})

test('MCP over HTTP needs the API key, as a bearer token', async () => {
  for (const auth of ['Bearer wrong', server.apiKey, `Basic ${server.apiKey}`, 'Bearer ']) {
    const res = await fetch(server.env.E2B_API_URL + '/mcp', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', Authorization: auth },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
    })
    assert.equal(res.status, 401, auth)
  }
})

test('airlock mcp over stdio', async () => {
  const gvisor = process.env.AIRLOCK_TEST_BACKEND === 'gvisor'
  const stateDir = mkdtempSync(join(tmpdir(), 'airlock-mcp-test-'))
  const bin = process.env.AIRLOCK_BIN ?? resolve(import.meta.dirname, '../../bin/airlock')
  // MCP clients give a server a minimal environment: runsc by flag.
  const runsc = process.env.AIRLOCK_RUNSC ? ['--runsc', process.env.AIRLOCK_RUNSC] : []
  const args = ['mcp', '--state-dir', stateDir, '--pool-size', '0', ...(gvisor ? ['--backend', 'gvisor', ...runsc] : [])]
  const transport = new StdioClientTransport({ command: bin, args, stderr: 'pipe' })
  let log = ''
  transport.stderr?.on('data', (d) => { log += d })
  const client = new Client({ name: 'airlock-test', version: '1.0.0' })
  try {
    try {
      await client.connect(transport)
      const res = await client.callTool({ name: 'run_code', arguments: { code: 'import os; os.getuid(), 6 * 7' } })
      assert.equal(text(res), '(1000, 42)', log)
      const kernel = await client.callTool({ name: 'run_command', arguments: { command: 'uname -r' } })
      assert.equal(/gvisor/.test(text(kernel)), gvisor, text(kernel))
    } finally {
      await client.close()
    }
    // Closing stdin ends the server and its sandbox.
    const held = join(stateDir, gvisor ? 'gvisor/bundles' : 'run/runs')
    for (let i = 0; i < 50 && existsSync(held) && readdirSync(held).length > 0; i++) await sleep(100)
    assert.deepEqual(existsSync(held) ? readdirSync(held) : [], [], log)
  } finally {
    rmSync(stateDir, { recursive: true, force: true })
  }
})
