// Airlock's console: log in with the API key, then the sandboxes, one
// sandbox, the playground, the pools and the volumes, each a page of the
// URL's hash (#/sandboxes, #/sandboxes/ID, #/playground, #/pools,
// #/volumes, #/volumes/ID).
import { render } from 'preact'
import { useEffect, useState } from 'preact/hooks'
import { AuthError, listPools, session } from './api'
import { Sandboxes } from './sandboxes'
import { SandboxPage } from './sandbox'
import { Playground } from './playground'
import { Pools } from './pools'
import { VolumePage, Volumes } from './volumes'
import './style.css'

function useHash(): string {
  const [hash, setHash] = useState(location.hash || '#/sandboxes')
  useEffect(() => {
    const on = () => setHash(location.hash || '#/sandboxes')
    addEventListener('hashchange', on)
    return () => removeEventListener('hashchange', on)
  }, [])
  return hash
}

function Login({ onLogin }: { onLogin: () => void }) {
  const [key, setKey] = useState('')
  const [error, setError] = useState('')
  const submit = async (e: Event) => {
    e.preventDefault()
    session.set(key.trim())
    try {
      await listPools() // any call with the key tells whether it is right
      onLogin()
    } catch (err) {
      session.clear()
      setError(err instanceof AuthError ? 'That API key was refused.' : String(err))
    }
  }
  return (
    <form class="login" onSubmit={submit}>
      <h1>Airlock</h1>
      <p>The API key is the one <code>airlock serve</code> printed (<code>E2B_API_KEY</code>). It stays in this tab only.</p>
      <input id="api-key" type="password" autocomplete="off" placeholder="e2b_…" value={key} onInput={(e) => setKey((e.target as HTMLInputElement).value)} />
      <button type="submit">Log in</button>
      {error && <p class="error" role="alert">{error}</p>}
    </form>
  )
}

function App() {
  const [loggedIn, setLoggedIn] = useState(session.key !== '')
  const hash = useHash()
  if (!loggedIn) return <Login onLogin={() => setLoggedIn(true)} />
  const logout = () => {
    session.clear()
    setLoggedIn(false)
  }
  const [, page, id] = hash.split('/')
  return (
    <>
      <nav>
        <strong>Airlock</strong>
        <a href="#/sandboxes" class={page === 'sandboxes' ? 'on' : ''}>Sandboxes</a>
        <a href="#/playground" class={page === 'playground' ? 'on' : ''}>Playground</a>
        <a href="#/pools" class={page === 'pools' ? 'on' : ''}>Pools</a>
        <a href="#/volumes" class={page === 'volumes' ? 'on' : ''}>Volumes</a>
        <button class="link" onClick={logout}>Log out</button>
      </nav>
      <main>
        {page === 'sandboxes' && !id && <Sandboxes onAuthError={logout} />}
        {page === 'sandboxes' && id && <SandboxPage id={decodeURIComponent(id)} />}
        {page === 'playground' && <Playground />}
        {page === 'pools' && <Pools />}
        {page === 'volumes' && !id && <Volumes />}
        {page === 'volumes' && id && <VolumePage id={decodeURIComponent(id)} />}
      </main>
    </>
  )
}

render(<App />, document.getElementById('app')!)
