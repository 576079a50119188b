// Charts as data through the official SDK (@e2b/code-interpreter,
// pinned): a matplotlib figure comes back with `result.chart`, typed as
// E2B's SDK types it, whose elements are the values plotted; the same for
// figures of pandas' .plot() and seaborn; `result.data` for DataFrames;
// PIL's Image.show() as an image result.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { startServer } from './harness.mjs'

let server
let sbx
before(async () => {
  server = await startServer(['--pool-size', '1'])
  sbx = await Sandbox.create()
  await sbx.runCode('import matplotlib.pyplot as plt\nimport pandas as pd')
})
after(async () => {
  await sbx?.kill()
  const { code, leftover } = await server.stop()
  assert.equal(code, 0)
  assert.deepEqual(leftover, [])
})

// chartOf runs code and returns the chart of its one figure, which also
// came as a PNG.
async function chartOf(code) {
  const r = await sbx.runCode(code)
  assert.equal(r.error, undefined, JSON.stringify(r.error))
  const figures = r.results.filter((x) => x.chart)
  assert.equal(figures.length, 1, JSON.stringify(r.results.map((x) => Object.keys(x.raw))))
  assert.ok(figures[0].png, 'the figure as a PNG too')
  assert.deepEqual(figures[0].extra, {}, 'nothing unknown beside')
  return figures[0].chart
}

// The fields each chart type always has, nulls included (E2B's Python
// SDK reads every one of them).
const fields = {
  line: ['type', 'title', 'elements', 'x_label', 'y_label', 'x_unit', 'y_unit', 'x_ticks', 'x_tick_labels', 'x_scale', 'y_ticks', 'y_tick_labels', 'y_scale'],
  bar: ['type', 'title', 'elements', 'x_label', 'y_label', 'x_unit', 'y_unit'],
  pie: ['type', 'title', 'elements'],
  box_and_whisker: ['type', 'title', 'elements', 'x_label', 'y_label', 'x_unit', 'y_unit'],
}
fields.scatter = fields.line
function assertShape(chart) {
  assert.deepEqual(Object.keys(chart).sort(), [...fields[chart.type]].sort(), `the fields of a ${chart.type} chart`)
}

test('a line plot: its series, points, labels, units and scales', async () => {
  const c = await chartOf(`
plt.plot([1, 2, 3], [10, 20, 15], label='sales')
plt.plot([1, 2, 3], [5, 6, 7], label='costs')
plt.title('Q1'); plt.xlabel('Month'); plt.ylabel('Amount (USD)'); plt.legend(); plt.show()`)
  assertShape(c)
  assert.equal(c.type, 'line')
  assert.equal(c.title, 'Q1')
  assert.equal(c.x_label, 'Month')
  assert.equal(c.y_unit, 'USD')
  assert.equal(c.x_unit, null)
  assert.equal(c.x_scale, 'linear')
  assert.deepEqual(c.elements.map((e) => e.label), ['sales', 'costs'])
  assert.deepEqual(c.elements[0].points, [[1, 10], [2, 20], [3, 15]])
  assert.deepEqual(c.elements[1].points, [[1, 5], [2, 6], [3, 7]])
  assert.equal(c.x_ticks.length, c.x_tick_labels.length)
})

test('a bar chart: a bar for each category, with its value and group', async () => {
  const c = await chartOf(`
plt.bar(['Ann', 'Bob', 'Cy'], [120, 80, 95], label='books')
plt.title('Books read'); plt.xlabel('Authors'); plt.ylabel('Count'); plt.show()`)
  assertShape(c)
  assert.equal(c.type, 'bar')
  assert.equal(c.x_label, 'Authors')
  assert.deepEqual(c.elements, [
    { label: 'Ann', value: 120, group: 'books' },
    { label: 'Bob', value: 80, group: 'books' },
    { label: 'Cy', value: 95, group: 'books' },
  ])
})

test('a pie: each slice with its angle in degrees', async () => {
  const c = await chartOf(`plt.pie([60, 30, 10], labels=['rent', 'food', 'fun']); plt.title('Budget'); plt.show()`)
  assertShape(c)
  assert.equal(c.type, 'pie')
  assert.equal(c.title, 'Budget')
  assert.deepEqual(c.elements.map((e) => [e.label, e.angle, e.radius]), [['rent', 216, 1], ['food', 108, 1], ['fun', 36, 1]])
})

test('a scatter plot: its points', async () => {
  const c = await chartOf(`plt.scatter([1, 2, 3, 4], [4, 1, 3, 2], label='runs'); plt.xscale('log'); plt.show()`)
  assertShape(c)
  assert.equal(c.type, 'scatter')
  assert.equal(c.x_scale, 'log')
  assert.deepEqual(c.elements, [{ label: 'runs', points: [[1, 4], [2, 1], [3, 3], [4, 2]] }])
})

test('a box plot: the statistics of each box', async () => {
  const c = await chartOf(`plt.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4, 5, 6]], labels=['A', 'B']); plt.show()`)
  assertShape(c)
  assert.equal(c.type, 'box_and_whisker')
  assert.deepEqual(c.elements, [
    { label: 'A', min: 1, first_quartile: 2.25, median: 3.5, third_quartile: 4.75, max: 5, outliers: [20] },
    { label: 'B', min: 2, first_quartile: 3, median: 4, third_quartile: 5, max: 6, outliers: [] },
  ])
})

test('a figure of two axes is a superchart of both', async () => {
  const c = await chartOf(`
fig, (a, b) = plt.subplots(1, 2)
a.plot([0, 1], [1, 3]); b.bar(['x', 'y'], [2, 5]); fig.suptitle('Both'); plt.show()`)
  assert.equal(c.type, 'superchart')
  assert.equal(c.title, 'Both')
  assert.deepEqual(c.elements.map((e) => e.type), ['line', 'bar'])
  assert.deepEqual(c.elements[1].elements.map((e) => e.value), [2, 5])
})

test("pandas' .plot() and seaborn's plots give the same data", async () => {
  const df = await chartOf(`
df = pd.DataFrame({'day': [1, 2, 3], 'visits': [5, 9, 7]})
df.plot(x='day', y='visits', title='Visits'); plt.show()`)
  assert.equal(df.type, 'line')
  assert.equal(df.title, 'Visits')
  assert.deepEqual(df.elements, [{ label: 'visits', points: [[1, 5], [2, 9], [3, 7]] }])
  const bars = await chartOf(`df.plot.bar(x='day', y='visits'); plt.show()`)
  assert.deepEqual(bars.elements.map((e) => [e.label, e.value, e.group]), [['1', 5, 'visits'], ['2', 9, 'visits'], ['3', 7, 'visits']])
  const sns = await chartOf(`
import seaborn as sns
sns.barplot(x=['a', 'b', 'a', 'b'], y=[1, 3, 3, 5], errorbar=None); plt.show()`)
  assert.equal(sns.type, 'bar')
  assert.deepEqual(sns.elements.map((e) => [e.label, e.value]), [['a', 2], ['b', 4]], 'the means seaborn plots')
  const line = await chartOf(`sns.lineplot(x=[1, 2, 1, 2], y=[1, 3, 3, 5]); plt.show()`)
  assert.equal(line.type, 'line', 'a line with its confidence band')
  assert.deepEqual(line.elements[0].points, [[1, 2], [2, 4]])
})

test('what is not a known chart is "unknown", with its title', async () => {
  const c = await chartOf(`plt.imshow([[1, 2], [3, 4]]); plt.title('heat'); plt.show()`)
  assert.deepEqual(c, { type: 'unknown', title: 'heat', elements: [] })
})

test('a DataFrame comes back as data, column by column', async () => {
  const r = await sbx.runCode(`pd.DataFrame({'name': ['a', 'b'], 'n': [1, 2], 'when': pd.to_datetime(['2024-01-02', '2024-03-04'])})`)
  assert.equal(r.error, undefined)
  assert.deepEqual(r.results[0].data, { name: ['a', 'b'], n: [1, 2], when: ['2024-01-02T00:00:00', '2024-03-04T00:00:00'] })
  assert.match(r.results[0].html, /<table/)
})

test("PIL's Image.show() displays the image as a result", async () => {
  const r = await sbx.runCode(`from PIL import Image\nImage.new('RGB', (32, 16), 'teal').show()`)
  assert.equal(r.error, undefined)
  const png = r.results.find((x) => x.png)
  assert.ok(png, JSON.stringify(r.results.map((x) => Object.keys(x.raw))))
  const buf = Buffer.from(png.png, 'base64')
  assert.deepEqual([buf.readUInt32BE(16), buf.readUInt32BE(20)], [32, 16])
})
