// What a cell produced, shown without ever letting it into the console's
// page: text as text, images as <img> of data: URLs (an SVG too: an image
// runs no script), and HTML only inside an iframe whose sandbox attribute
// gives it an opaque origin and no scripts: it can neither run code nor
// reach this page, whatever it contains.
import type { ExecutionError, Result } from '@e2b/code-interpreter'

export type Item =
  | { kind: 'stdout' | 'stderr'; text: string }
  | { kind: 'result'; result: Result }
  | { kind: 'error'; error: ExecutionError }

function ResultView({ r }: { r: Result }) {
  if (r.png) return <img class="figure" alt="PNG result" src={`data:image/png;base64,${r.png}`} />
  if (r.jpeg) return <img class="figure" alt="JPEG result" src={`data:image/jpeg;base64,${r.jpeg}`} />
  if (r.svg) return <img class="figure" alt="SVG result" src={`data:image/svg+xml;base64,${btoa(unescape(encodeURIComponent(r.svg)))}`} />
  if (r.html) return <iframe class="html" title="HTML result" sandbox="" srcdoc={r.html} />
  if (r.markdown) return <pre class="text">{r.markdown}</pre>
  return <pre class="text">{r.text ?? JSON.stringify(r.raw)}</pre>
}

export function Output({ items }: { items: Item[] }) {
  return (
    <div class="output">
      {items.map((it) => {
        switch (it.kind) {
          case 'stdout':
          case 'stderr':
            return <pre class={it.kind}>{it.text}</pre>
          case 'result':
            return <ResultView r={it.result} />
          case 'error':
            return (
              <div class="cell-error">
                <strong>{it.error.name}: {it.error.value}</strong>
                <pre>{it.error.traceback}</pre>
              </div>
            )
        }
      })}
    </div>
  )
}
