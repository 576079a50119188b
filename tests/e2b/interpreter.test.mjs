// The official code-interpreter SDK (@e2b/code-interpreter, pinned) against
// a real airlock serve: Jupyter kernels inside the sandbox, rich results.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { startServer } from './harness.mjs'

let server
let sbx
before(async () => {
  server = await startServer(['--pool-size', '1'])
  sbx = await Sandbox.create()
})
after(async () => {
  await sbx?.kill()
  const { code, leftover } = await server.stop()
  assert.equal(code, 0)
  assert.deepEqual(leftover, [])
})

// pngSize reads the width and height from a PNG's IHDR chunk.
function pngSize(b64) {
  const png = Buffer.from(b64, 'base64')
  assert.equal(png.subarray(1, 4).toString(), 'PNG', 'a PNG image')
  return [png.readUInt32BE(16), png.readUInt32BE(20)]
}

test('state persists between cells; the last expression is the result', async () => {
  await sbx.runCode('x = 41')
  const r = await sbx.runCode('x + 1')
  assert.equal(r.text, '42')
  assert.equal(r.results.length, 1)
  assert.equal(r.results[0].isMainResult, true)
  assert.ok(r.executionCount > 0)
})

test('print goes to stdout and stderr logs, streamed before the cell ends', async () => {
  const seen = []
  let done = false
  const r = await sbx.runCode('import sys, time\nprint("first", flush=True)\ntime.sleep(1)\nprint("oops", file=sys.stderr)', {
    onStdout: (m) => seen.push([m.line, done]),
  })
  done = true
  assert.deepEqual(r.logs.stdout, ['first\n'])
  assert.deepEqual(r.logs.stderr, ['oops\n'])
  assert.deepEqual(seen, [['first\n', false]], 'stdout arrived while the cell ran')
})

test('a matplotlib figure comes back as a PNG of the figure\'s size, without show()', async () => {
  const r = await sbx.runCode(`
%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}
import matplotlib.pyplot as plt
fig = plt.figure(figsize=(4, 3), dpi=100)
plt.plot([1, 3, 2])
None`)
  assert.equal(r.error, undefined)
  const pngs = r.results.filter((x) => x.png)
  assert.equal(pngs.length, 1, JSON.stringify(r.results.map((x) => Object.keys(x.raw))))
  assert.deepEqual(pngSize(pngs[0].png), [400, 300])
  assert.equal(pngs[0].isMainResult, false, 'a display, not the cell\'s value')
})

test('a DataFrame comes back as an HTML table', async () => {
  const r = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')
  assert.match(r.results[0].html, /<table/)
  assert.match(r.text, /a\s+b/)
})

test('non-ASCII output arrives intact', async () => {
  const r = await sbx.runCode('print("héllo wörld ✓ 🎉"); "日本"')
  assert.deepEqual(r.logs.stdout, ['héllo wörld ✓ 🎉\n'])
  assert.equal(r.text, '日本')
})

test('an exception is an error with name, value and traceback', async () => {
  const r = await sbx.runCode('1/0')
  assert.equal(r.error.name, 'ZeroDivisionError')
  assert.equal(r.error.value, 'division by zero')
  assert.match(r.error.traceback, /ZeroDivisionError/)
  assert.equal(r.results.length, 0)
})

test('env vars apply to one execution', async () => {
  const r = await sbx.runCode('import os; os.environ.get("MODE")', { envs: { MODE: 'test' } })
  assert.equal(r.text, 'test', "one pair of quotes is stripped, as E2B's server does")
  const after = await sbx.runCode('import os; os.environ.get("MODE")')
  assert.equal(after.text, undefined)
})

test('a runaway cell stops at its timeout and the context stays usable', async () => {
  await sbx.runCode('kept = "still here"')
  await assert.rejects(sbx.runCode('while True: pass', { timeoutMs: 1500 }))
  const r = await sbx.runCode('kept')
  assert.equal(r.text, 'still here', JSON.stringify({ error: r.error, logs: r.logs }))
})

test('two contexts are independent; contexts can be listed, restarted and removed', async () => {
  const a = await sbx.createCodeContext({ cwd: '/tmp' })
  const b = await sbx.createCodeContext()
  await sbx.runCode('v = "a"', { context: a })
  const inB = await sbx.runCode('v', { context: b })
  assert.equal(inB.error.name, 'NameError')
  const cwd = await sbx.runCode('import os; os.getcwd()', { context: a })
  assert.equal(cwd.text, '/tmp')
  const ids = (await sbx.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes(a.id) && ids.includes(b.id))
  await sbx.restartCodeContext(a)
  assert.equal((await sbx.runCode('v', { context: a })).error.name, 'NameError', 'a restart clears state')
  await sbx.removeCodeContext(a)
  await sbx.removeCodeContext(b)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === a.id))
})

test('a kernel killed by the memory limit is reported and replaced', async () => {
  // Many modest allocations: no single one fails, so the OOM killer acts.
  const r = await sbx.runCode('hog = [bytearray(64 << 20) for _ in range(64)]')
  assert.equal(r.error?.name, 'KernelDied', JSON.stringify(r.error))
  const next = await sbx.runCode('1 + 1')
  assert.equal(next.text, '2', 'the next execution works')
})
