// Benchmark of MCP tool calls through the official MCP TypeScript client.
// Prints medians and 99th percentiles; asserts nothing. Baseline in the
// same run: the same cell through @e2b/code-interpreter, on the same server.
import { Sandbox } from '@e2b/code-interpreter'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { pct, fmt, time } from './bench-util.mjs'
import { startServer, sleep } from './harness.mjs'

const N = 200

async function cells(call) {
  for (let i = 0; i < 10; i++) await call()
  // The sandbox came from the pool: let its replacement start its kernel
  // (over a second of CPU) before measuring.
  await sleep(3000)
  const xs = []
  for (let i = 0; i < N; i++) xs.push(await time(call))
  return xs
}

const server = await startServer(['--pool-size', '1'])
const sbx = await Sandbox.create()
const e2b = await cells(() => sbx.runCode('1+1'))
await sbx.kill()

const http = new Client({ name: 'bench', version: '1' })
const httpTransport = new StreamableHTTPClientTransport(new URL(server.env.E2B_API_URL + '/mcp'), {
  requestInit: { headers: { Authorization: `Bearer ${server.apiKey}` } },
})
await http.connect(httpTransport)
const overHTTP = await cells(() => http.callTool({ name: 'run_code', arguments: { code: '1+1' } }))
await httpTransport.terminateSession()
await http.close()
await server.stop()

const stateDir = mkdtempSync(join(tmpdir(), 'airlock-mcp-bench-'))
const bin = process.env.AIRLOCK_BIN ?? resolve(import.meta.dirname, '../../bin/airlock')
const stdio = new Client({ name: 'bench', version: '1' })
await stdio.connect(new StdioClientTransport({ command: bin, args: ['mcp', '--state-dir', stateDir], stderr: 'ignore' }))
const overStdio = await cells(() => stdio.callTool({ name: 'run_code', arguments: { code: '1+1' } }))
await stdio.close()
rmSync(stateDir, { recursive: true, force: true })

const ratio = (xs) => `${(pct(xs, 50) / pct(e2b, 50)).toFixed(2)}x baseline`
console.log("run_code('1+1') in a warm sandbox, official clients")
console.log(`  baseline: @e2b/code-interpreter runCode   ${fmt(e2b)}`)
console.log(`  MCP over streamable HTTP (/mcp)          ${fmt(overHTTP)}   ${ratio(overHTTP)}`)
console.log(`  MCP over stdio (airlock mcp)             ${fmt(overStdio)}   ${ratio(overStdio)}`)
