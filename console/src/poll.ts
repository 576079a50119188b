import { useEffect } from 'preact/hooks'

// usePoll runs load at once and then every ms, until the component goes
// or deps change; load is told whether its answer is still wanted.
export function usePoll(load: (wanted: () => boolean) => Promise<unknown>, ms: number, deps: unknown[]) {
  useEffect(() => {
    let stop = false
    const run = () => {
      load(() => !stop).catch(() => {})
    }
    run()
    const t = setInterval(run, ms)
    return () => {
      stop = true
      clearInterval(t)
    }
  }, deps)
}
