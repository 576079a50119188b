// The web console end to end: Debian's Chromium, driven headless by
// playwright-core, against a real airlock serve. Log in with the key;
// see a sandbox created by the SDK appear; in the playground create one,
// run a matplotlib cell (an <img> whose PNG decodes), a DataFrame (its
// table inside the isolated frame), a cell whose HTML tries to script the
// console (it cannot), a terminal (echo hi); a sandbox's page with its
// audit trail; the pools;
// kill a sandbox and see it leave; a volume's files. Screenshots of each page go to
// AIRLOCK_SCREENSHOTS (default: a temporary directory, printed).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { chromium } from 'playwright-core'
import { Sandbox, Volume } from 'e2b'
import { startServer } from './harness.mjs'

const chromiumPath = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync)
const skip = !chromiumPath && "no Chromium here (Debian's chromium package; make test installs it)"
// Screenshots are kept where AIRLOCK_SCREENSHOTS names; else they are
// taken (drawing each page proves it renders) into a directory removed
// afterwards.
const keptShots = process.env.AIRLOCK_SCREENSHOTS
const shots = keptShots ?? mkdtempSync(join(tmpdir(), 'airlock-console-shots-'))

let server, browser, page
const consoleErrors = []
before(async () => {
  if (skip) return
  mkdirSync(shots, { recursive: true })
  server = await startServer(['--pool-size', '1'])
  // Flags as this machine's probe found Chromium needs here: nothing in
  // the background reaches out (the network is closed), no sandbox of its
  // own (it runs as root). Playwright gives it a fresh profile, removed
  // at close.
  browser = await chromium.launch({
    executablePath: chromiumPath, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  })
  page = await browser.newPage({ viewport: { width: 1280, height: 860 } })
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()) })
  await page.goto(server.env.E2B_API_URL + '/')
})
after(async () => {
  if (!keptShots) rmSync(shots, { recursive: true, force: true })
  if (skip) return
  await browser?.close()
  const { code, leftover } = await server.stop()
  if (keptShots) console.log(`console screenshots: ${shots}`)
  assert.equal(code, 0)
  assert.deepEqual(leftover, [])
})

const shot = (name) => page.screenshot({ path: join(shots, `${name}.png`), fullPage: true })

test('the console is served with a strict policy, and asks for the key', { skip }, async () => {
  const res = await fetch(server.env.E2B_API_URL + '/')
  const csp = res.headers.get('content-security-policy')
  assert.match(csp, /script-src 'self'(;|$)/, 'scripts from the server only, none inline')
  assert.match(csp, /frame-ancestors 'none'/)
  assert.doesNotMatch(await res.text(), /<script>(?!<\/script>)|<script [^>]*>[^<]/, 'no inline script in the page')
  await page.locator('#api-key').fill('e2b_wrong')
  await page.getByRole('button', { name: 'Log in' }).click()
  await page.getByRole('alert').filter({ hasText: 'refused' }).waitFor()
  await shot('login')
  await page.locator('#api-key').fill(server.apiKey)
  await page.getByRole('button', { name: 'Log in' }).click()
  await page.locator('table.sandboxes').waitFor()
  assert.ok(!page.url().includes(server.apiKey), 'the key is never in the URL')
  assert.equal(await page.evaluate(() => localStorage.length), 0, 'nor in localStorage')
})

test('a sandbox the SDK creates appears in the table, with its metadata; killed, it leaves', { skip }, async () => {
  const sbx = await Sandbox.create({ metadata: { owner: 'console-test' } })
  const row = page.locator(`tr[data-id="${sbx.sandboxId}"]`)
  await row.waitFor()
  assert.match(await row.textContent(), /owner=console-test/)
  assert.match(await row.textContent(), /running/)
  await page.locator('input[aria-label="metadata"]').fill('owner=console-test')
  await page.waitForFunction(() => document.querySelectorAll('table.sandboxes tbody tr').length === 1)
  await row.locator('td', { hasText: '%' }).first().waitFor() // its CPU share, from getMetrics
  await shot('sandboxes')
  await row.getByRole('button', { name: 'kill' }).click()
  await row.waitFor({ state: 'detached' })
  assert.equal(await sbx.isRunning(), false)
  await page.locator('input[aria-label="metadata"]').fill('')
})

test('the playground: a chart, a table in its isolated frame, HTML that cannot script the console, a terminal', { skip }, async () => {
  await page.goto(server.env.E2B_API_URL + '/#/playground')
  await page.locator('#create').click()
  await page.locator('#current').waitFor()
  const id = await page.locator('#current').textContent()

  const run = async (code) => {
    await page.locator('#code').fill(code)
    await page.locator('#run').click()
    await page.locator('#run', { hasText: 'Run' }).waitFor()
  }
  await run('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()')
  const img = page.locator('.output img.figure')
  await img.waitFor()
  const size = await img.evaluate(async (el) => { await el.decode(); return [el.naturalWidth, el.naturalHeight] })
  assert.ok(size[0] > 100 && size[1] > 100, `the PNG decodes: ${size}`)
  await shot('playground-chart')

  await run('import pandas as pd\npd.DataFrame({"city": ["Oslo", "Lima"], "temp": [4.5, 19]})')
  const frame = page.locator('.output iframe.html')
  await frame.waitFor()
  assert.equal(await frame.getAttribute('sandbox'), '', 'an iframe sandboxed with nothing allowed')
  assert.match(await page.frameLocator('.output iframe.html').locator('table').textContent(), /Oslo/)
  await shot('playground-table')

  // HTML that tries to reach the console: a script, an event handler, a
  // script link. None may run, here or in the console.
  const title = await page.title()
  await run(`from IPython.display import HTML, display
display(HTML('<b id="probe">html</b><script>parent.document.title = "owned"; window.top.owned = 1</script>' +
  '<img src="x" onerror="parent.document.title = \\'owned\\'"><a id="link" href="javascript:parent.document.title=1">x</a>'))`)
  await page.frameLocator('.output iframe.html').locator('#probe').waitFor()
  await page.frameLocator('.output iframe.html').locator('#link').click().catch(() => {})
  await page.waitForTimeout(300)
  assert.equal(await page.title(), title, 'the console was not scripted')
  assert.equal(await page.evaluate(() => window.owned), undefined)

  await page.locator('#tab-terminal').click()
  const term = page.locator('div.terminal .xterm-screen')
  await term.waitFor()
  await term.click()
  await page.keyboard.type('echo hi-from-$((40+2))\n')
  await page.locator('div.terminal .xterm-rows', { hasText: 'hi-from-42' }).waitFor({ timeout: 15_000 }).catch(async (err) => {
    await shot('playground-terminal-failed')
    throw new Error(`the terminal shows: ${JSON.stringify(await page.locator('div.terminal .xterm-rows').textContent())}: ${err.message}`)
  })
  await shot('playground-terminal')

  // The sandbox's page: its metrics, processes (one started here) and
  // files.
  const sbx = await Sandbox.connect(id)
  await sbx.commands.run('sleep 600', { background: true })
  await sbx.files.write('/home/user/notes.txt', 'hello from the console test')
  await page.goto(`${server.env.E2B_API_URL}/#/sandboxes/${id}`)
  await page.locator('.metrics svg').first().waitFor()
  await page.locator('.procs tbody tr', { hasText: 'sleep 600' }).waitFor()
  await page.locator('.files button', { hasText: 'notes.txt' }).waitFor()
  // Its audit trail: the create, by the key the console holds.
  await page.locator('.audit tbody tr', { hasText: /POST \/(v2\/)?sandboxes by key sha256:/ }).waitFor()
  await shot('sandbox')
  await Sandbox.kill(id)
})

test('the volumes page lists volumes and shows a volume\'s files as text', { skip }, async () => {
  const vol = await Volume.create('console-vol')
  try {
    await vol.writeFile('/docs/readme.txt', 'hello <b>volume</b>', { force: true })
    await page.goto(server.env.E2B_API_URL + '/#/volumes')
    await page.locator('tr[data-volume="console-vol"] a').click()
    await page.locator('tr[data-entry="docs"] button').click()
    await page.locator('tr[data-entry="readme.txt"] button').click()
    await page.locator('.preview pre').waitFor()
    assert.equal(await page.locator('.preview pre').textContent(), 'hello <b>volume</b>')
    assert.equal(await page.locator('.preview b').count(), 0, 'a file is shown as text, never as HTML')
    await shot('volume')
  } finally {
    await Volume.destroy(vol.volumeId)
  }
})

test('the pools page shows each template\'s pool', { skip }, async () => {
  await page.goto(server.env.E2B_API_URL + '/#/pools')
  const row = page.locator('tr[data-template="base"]')
  await row.waitFor()
  await page.waitForFunction(() => document.querySelector('tr[data-template="base"] td:nth-child(2)')?.textContent === '1')
  await shot('pools')
  assert.deepEqual(consoleErrors.filter((e) => /Content Security Policy|Refused/.test(e) && !/owned|javascript:/.test(e)), [], 'nothing of the console itself was refused by its policy')
})
