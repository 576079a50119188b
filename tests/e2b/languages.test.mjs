// The code interpreter's languages through the official SDK
// (@e2b/code-interpreter, pinned): Python, JavaScript and TypeScript
// (tslab's kernels on Node, on the stock Debian root; Deno's on the jail),
// R (IRkernel) and Bash (Airlock's kernel), each with its
// state, its errors and its envs, by the names E2B's SDKs give them; and
// a sandbox's own envs in kernels started before it was claimed.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { startServer } from './harness.mjs'

let server
before(async () => {
  // A pool, so that the sandboxes here are claimed with their Python
  // kernel already running.
  server = await startServer(['--pool-size', '1'])
})
after(async () => {
  const { code, leftover } = await server.stop()
  assert.equal(code, 0)
  assert.deepEqual(leftover, [])
})

// Per language: a cell that sets state, one that reads it back (its
// value, as text), one that fails (error name and value, and a line the
// traceback must show), and one that prints an env var.
const cases = {
  python: { set: 'x = 41', get: 'x + 1', want: '42', fail: 'def f():\n    return 1 / 0\nf()', name: 'ZeroDivisionError', value: 'division by zero', line: 'return 1 / 0', env: 'import os; print(os.environ["CELL_VAR"])' },
  js: { set: 'let x = 41', get: 'x + 1', want: '42', fail: 'function f() { throw new TypeError("bad input") }\nf()', name: 'TypeError', value: 'bad input', line: 'at f', env: 'console.log(process.env.CELL_VAR)' },
  ts: { set: 'const t: number = 41', get: 't + 1', want: '42', fail: 'const u: string = JSON.parse("{")', name: 'SyntaxError', value: 'JSON', line: 'JSON.parse', env: 'console.log(process.env.CELL_VAR)' },
  r: { set: 'x <- 41', get: 'x + 1', want: '[1] 42', fail: 'f <- function() stop("no way")\nf()', name: 'ERROR', value: 'no way', line: 'stop("no way")', env: 'cat(Sys.getenv("CELL_VAR"), "\\n", sep = "")' },
  bash: { set: 'X=41; cd /tmp', get: 'echo $((X + 1)) $PWD', want: '42 /tmp', fail: 'echo before; ls /no/such/place', name: 'ExitError', value: 'exit status 2', line: 'No such file', env: 'echo "$CELL_VAR"' },
}

for (const [language, c] of Object.entries(cases)) {
  test(`${language}: state persists between cells, errors are named, envs apply to one execution`, async () => {
    await inSandbox((sbx) => stateErrorsEnvs(sbx, language, c))
  })
}

// inSandbox runs f in a sandbox of its own: every kernel holds 70 (Bash)
// to 220 (Deno) MiB, and all of them together pass a sandbox's 512 MiB
// (on gVisor the whole sandbox then dies).
async function inSandbox(f) {
  const sbx = await Sandbox.create()
  try {
    await f(sbx)
  } finally {
    await sbx.kill()
  }
}

async function stateErrorsEnvs(sbx, language, c) {
  {
    assert.equal((await sbx.runCode(c.set, { language })).error, undefined)
    const r = await sbx.runCode(c.get, { language })
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    // IRkernel sends values as displays, not as the cell's result.
    const got = (r.text ?? r.results[0]?.text ?? r.logs.stdout.join('')).trim()
    assert.equal(got, c.want)

    const e = (await sbx.runCode(c.fail, { language })).error
    assert.ok(e, 'an error')
    assert.equal(e.name, c.name)
    assert.match(e.value, new RegExp(c.value))
    assert.ok(e.traceback.includes(c.line), `the traceback shows ${JSON.stringify(c.line)}:\n${e.traceback}`)
    assert.doesNotMatch(e.traceback, /\x1b\[/, 'no ANSI escape codes')

    const withEnv = await sbx.runCode(c.env, { language, envs: { CELL_VAR: `only-for-${language}` } })
    assert.equal(withEnv.logs.stdout.join('').trim(), `only-for-${language}`)
    const after = await sbx.runCode(c.env, { language })
    assert.notEqual(after.logs.stdout.join('').trim(), `only-for-${language}`, 'the env was put back')
  }
}

test('javascript: top-level await, and the language names E2B uses', () => inSandbox(async (sbx) => {
  const r = await sbx.runCode('await new Promise((ok) => setTimeout(ok, 20)); [1, 2, 3].map((n) => n * 2).join(",")', { language: 'javascript' })
  assert.equal(r.error, undefined)
  assert.equal(r.text, '2,4,6')
  // js and javascript, ts and typescript name the same contexts.
  await sbx.runCode('var shared = "same"', { language: 'js' })
  assert.equal((await sbx.runCode('shared', { language: 'javascript' })).text, 'same')
  const ctx = await sbx.createCodeContext({ language: 'TS' })
  assert.equal(ctx.language, 'typescript')
  assert.equal((await sbx.runCode('const k: number = 2; k ** 10', { context: ctx })).text, '1024')
}))

test('r: a data frame prints, and a plot comes back as a PNG', () => inSandbox(async (sbx) => {
  const df = await sbx.runCode('data.frame(city = c("Oslo", "Lima"), temp = c(4.5, 19))', { language: 'r' })
  assert.equal(df.error, undefined)
  assert.match(df.results[0].text, /Oslo/)
  assert.match(df.results[0].html, /<table/)
  const plot = await sbx.runCode('plot(1:10, main = "ten")', { language: 'r' })
  const png = plot.results.find((x) => x.png)
  assert.ok(png, JSON.stringify(plot.results.map((x) => Object.keys(x.raw))))
  assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG')
}))

test('a language without a kernel here is an error that names it', () => inSandbox(async (sbx) => {
  const java = await sbx.runCode('System.out.println(1);', { language: 'java' })
  assert.equal(java.error?.name, 'KernelError')
  assert.match(java.error.value, /no Jupyter kernel for java is installed/)
  const cobol = await sbx.runCode('1', { language: 'cobol' })
  assert.match(cobol.error?.value, /unknown language "cobol": bash, java, javascript, python, r, typescript/)
}))

test("a sandbox's envs reach its first cell in every language, the pool's prestarted kernel included", async () => {
  const s = await Sandbox.create({ envs: { SANDBOX_VAR: 'from-create' } })
  try {
    // The Python kernel ran before the sandbox was claimed.
    const py = await s.runCode('import os; os.environ.get("SANDBOX_VAR")')
    assert.equal(py.text, 'from-create')
    const js = await s.runCode('process.env.SANDBOX_VAR', { language: 'js' })
    assert.equal(js.text, 'from-create')
    const sh = await s.runCode('echo "$SANDBOX_VAR"', { language: 'bash' })
    assert.equal(sh.logs.stdout.join('').trim(), 'from-create')
  } finally {
    await s.kill()
  }
})

test('bash: an interrupted cell ends, and the shell keeps its state', () => inSandbox(async (sbx) => {
  await sbx.runCode('KEPT=yes', { language: 'bash' })
  await assert.rejects(sbx.runCode('sleep 30', { language: 'bash', timeoutMs: 1500 }))
  const r = await sbx.runCode('echo "$KEPT"', { language: 'bash' })
  assert.equal(r.logs.stdout.join('').trim(), 'yes')
}))
