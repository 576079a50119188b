// The stock templates as machines, as on E2B: base and
// code-interpreter-v1 on the Debian root, the default (made once per host,
// by make stock before the tests), through the official
// SDKs, in the fake internet. Root and sudo; apt, pip and npm installing
// from the lab's package servers (packages.test, internal/nettest) as
// user and as root; what is installed importable from the kernels;
// E2B's code-interpreter packages; the Template builder on each stock
// template. Every sandbox asks for the internet itself, whatever the
// server's default.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Template } from 'e2b'
import { Sandbox } from '@e2b/code-interpreter'
import { startServer } from './harness.mjs'

const labDNS = process.env.AIRLOCK_LAB_DNS
const skip = !labDNS && 'needs the fake internet: run under bin/netlab'

const net = { allowInternetAccess: true }
const pip = 'pip install -q --index-url http://packages.test/simple/ --trusted-host packages.test airlock-greet'
// apt with the lab's repository alone: the root's own sources name
// Debian's mirror, which is not in the lab.
const aptOnlyLab = '-o Dir::Etc::SourceParts=/dev/null -o Dir::Etc::SourceList=/etc/apt/lab.list'

let server
before(async () => {
  if (skip) return
  server = await startServer([], {
    config: {
      network: { dns: [labDNS] },
      templates: { base: { poolSize: 1 }, 'code-interpreter-v1': { poolSize: 1 }, jail: { poolSize: 0 } },
    },
  })
})
after(async () => {
  if (skip) return
  const { code, leftover } = await server.stop()
  assert.equal(code, 0)
  assert.deepEqual(leftover, [])
})

// run returns a command's output; a failure says what it wrote.
async function run(sbx, cmd, opts) {
  try {
    return (await sbx.commands.run(cmd, { timeoutMs: 300_000, ...opts })).stdout.trim()
  } catch (err) {
    throw new Error(`${cmd}: ${err.message}\n${err.stderr ?? ''}${err.stdout ?? ''}`)
  }
}

test('base: E2B\'s tools, user with passwordless sudo, root, a writable root', { skip }, async () => {
  const sbx = await Sandbox.create('base', net)
  try {
    assert.equal(await run(sbx, 'whoami; pwd'), 'user\n/home/user')
    for (const tool of ['bash', 'curl', 'git', 'python3', 'pip', 'node', 'npm', 'gcc', 'make', 'apt-get']) {
      assert.ok(await run(sbx, `command -v ${tool}`), `${tool} is on the PATH`)
    }
    assert.match(await run(sbx, 'python3 -m venv /tmp/venv && /tmp/venv/bin/python -c "import sys; print(sys.prefix)"'), /\/tmp\/venv/)
    assert.equal(await run(sbx, 'sudo id -u; sudo -n true && echo passwordless'), '0\npasswordless')
    assert.equal(await run(sbx, 'id -u', { user: 'root' }), '0')
    // The whole root is writable, by root: /opt, /usr/local/bin.
    await run(sbx, 'mkdir -p /opt/app && echo x > /opt/app/x && printf "#!/bin/sh\\necho tool\\n" > /usr/local/bin/tool && chmod +x /usr/local/bin/tool', { user: 'root' })
    assert.equal(await run(sbx, 'cat /opt/app/x; tool'), 'x\ntool')
    await run(sbx, 'sudo sh -c "echo y > /usr/local/share/by-sudo"')
    assert.equal(await run(sbx, 'cat /usr/local/share/by-sudo'), 'y')
  } finally {
    await sbx.kill()
  }
})

test('base: sudo apt-get install from the lab\'s apt repository', { skip }, async () => {
  const sbx = await Sandbox.create('base', net)
  try {
    await run(sbx, 'echo "deb [trusted=yes] http://packages.test/debian ./" | sudo tee /etc/apt/lab.list >/dev/null')
    await run(sbx, `sudo apt-get ${aptOnlyLab} update -qq && sudo apt-get ${aptOnlyLab} install -y -qq airlock-hello`)
    assert.equal(await run(sbx, 'airlock-hello'), 'hello from a deb')
    assert.match(await run(sbx, 'dpkg-query -W airlock-hello'), /airlock-hello\s+1\.0/)
  } finally {
    await sbx.kill()
  }
})

for (const user of ['user', 'root']) {
  test(`code-interpreter-v1: pip install as ${user}, then import in the kernel`, { skip }, async () => {
    const sbx = await Sandbox.create(net)
    try {
      await run(sbx, pip, { user })
      const where = await run(sbx, 'python3 -c "import airlock_greet; print(airlock_greet.__file__)"')
      assert.match(where, user === 'root' ? /^\/usr\/local\/lib\/python3[.\d]*\/dist-packages\// : /^\/home\/user\/\.local\/lib\//)
      // The kernel started in the pool, before the install.
      const exec = await sbx.runCode('import airlock_greet\nairlock_greet.greet()')
      assert.equal(exec.error, undefined, exec.error?.traceback)
      assert.equal(exec.text, 'hello from a wheel')
    } finally {
      await sbx.kill()
    }
  })
}

test('code-interpreter-v1: npm install, then require in a JavaScript cell; top-level await; TypeScript', { skip }, async () => {
  const sbx = await Sandbox.create(net)
  try {
    await run(sbx, 'npm install --no-audit --no-fund --registry http://packages.test/npm/ airlock-greet-js')
    const exec = await sbx.runCode("const g = require('airlock-greet-js')\ng.greet()", { language: 'js' })
    assert.equal(exec.error, undefined, exec.error?.traceback)
    assert.equal(exec.text, 'hello from npm')
    const fs = await sbx.runCode("require('fs').existsSync('/home/user/node_modules/airlock-greet-js')", { language: 'js' })
    assert.equal(fs.text, 'true')
    const awaited = await sbx.runCode('await new Promise((ok) => setTimeout(() => ok(6 * 7), 10))', { language: 'js' })
    assert.equal(awaited.text, '42')
    const ts = await sbx.runCode('const n: number = 6 * 7\nn', { language: 'ts' })
    assert.equal(ts.error, undefined, ts.error?.traceback)
    assert.equal(ts.text, '42')
    // An exception is the cell's error, by its name and message, and a
    // cell after a failed one runs (tslab, patched: it wrote the error
    // on stderr alone, and aborted cells for 200 ms after it).
    const bad = await sbx.runCode("throw new TypeError('boom')", { language: 'js' })
    assert.equal(bad.error?.name, 'TypeError', JSON.stringify(bad))
    assert.equal(bad.error?.value, 'boom')
    const late = await sbx.runCode("await Promise.reject(new RangeError('late'))", { language: 'js' })
    assert.equal(late.error?.name, 'RangeError', JSON.stringify(late))
    assert.equal((await sbx.runCode('1 + 1', { language: 'js' })).text, '2')
    const env = await sbx.runCode('process.env.CELL_VAR', { language: 'js', envs: { CELL_VAR: 'set for one cell' } })
    assert.equal(env.text, 'set for one cell')
    assert.equal((await sbx.runCode('process.env.CELL_VAR === undefined', { language: 'js' })).text, 'true')
  } finally {
    await sbx.kill()
  }
})

test('code-interpreter-v1: E2B\'s packages as Debian has them', { skip }, async () => {
  const sbx = await Sandbox.create()
  try {
    const exec = await sbx.runCode('import sklearn, scipy, plotly, requests, bs4, cv2, openpyxl, sympy, nltk, xarray\n' +
      'from sklearn.linear_model import LinearRegression\n' +
      'LinearRegression().fit([[0], [1], [2]], [0, 2, 4]).predict([[3]])[0].round(6)')
    assert.equal(exec.error, undefined, exec.error?.traceback)
    assert.equal(exec.text, '6.0')
  } finally {
    await sbx.kill()
  }
})

test('Template builder: fromTemplate of each stock template', { skip, timeout: 600_000 }, async () => {
  const ci = Template()
    .fromTemplate('code-interpreter-v1')
    .setEnvs({ PIP_INDEX_URL: 'http://packages.test/simple/', PIP_TRUSTED_HOST: 'packages.test' })
    .pipInstall(['airlock-greet'])
  await Template.build(ci, 'ci-greet')
  const base = Template()
    .fromTemplate('base')
    .runCmd('echo "deb [trusted=yes] http://packages.test/debian ./" > /etc/apt/sources.list.d/lab.list && rm /etc/apt/sources.list.d/debian.sources', { user: 'root' })
    .aptInstall(['airlock-hello'])
  await Template.build(base, 'base-hello')
  const a = await Sandbox.create('ci-greet')
  try {
    const exec = await a.runCode('import airlock_greet\nairlock_greet.greet()')
    assert.equal(exec.error, undefined, exec.error?.traceback)
    assert.equal(exec.text, 'hello from a wheel')
    assert.equal(await run(a, 'sudo id -u'), '0')
  } finally {
    await a.kill()
  }
  const b = await Sandbox.create('base-hello')
  try {
    assert.equal(await run(b, 'airlock-hello'), 'hello from a deb')
  } finally {
    await b.kill()
  }
})
