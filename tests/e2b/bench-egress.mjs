// The cost of request rules (E2B's network.rules), in the fake internet
// (run it under tests/netlab; `make bench-egress` does): HTTPS requests on
// fresh connections and one large HTTPS download, from the host straight
// to the lab's server (no proxy), from a sandbox through the proxy that
// relays TLS as it is (a host without rules), and from a sandbox through
// the proxy that terminates it, sets a header with a secret and opens its
// own TLS to the server (a host with rules), in the same run, rounds
// alternating.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, writeFileSync, rmSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox, Secret } from 'e2b'
import { startServer } from './harness.mjs'

if (!process.env.AIRLOCK_LAB_DNS) {
  console.error('bench-egress needs the fake internet: run it under tests/netlab (make bench-egress)')
  process.exit(2)
}

// n requests to host at addr, each on a fresh TLS connection, verified
// against cafile (the system's store when "-"); then one download of size
// bytes. By address: no lookup in what is measured.
// Prints the median and 99th percentile latency (ms) and MB/s.
const client = String.raw`
import socket, ssl, sys, time
host, addr, n, size, cafile = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ctx = ssl.create_default_context(cafile=None if cafile == "-" else cafile)
def get(path):
    c = socket.create_connection((addr, 443))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s = ctx.wrap_socket(c, server_hostname=host)
    s.sendall(b"GET " + path.encode() + b" HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
    got = 0
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        got += len(b)
    s.close()
    return got
lat = []
for _ in range(n):
    t = time.perf_counter()
    get("/")
    lat.append(time.perf_counter() - t)
lat.sort()
t = time.perf_counter()
got = get("/bytes?n=%d" % size)
print(lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000, got / (time.perf_counter() - t) / 1e6)
`

const dir = mkdtempSync(join(tmpdir(), 'airlock-bench-egress-'))
writeFileSync(join(dir, 'client.py'), client)
const server = await startServer([], {
  config: { network: { dns: [process.env.AIRLOCK_LAB_DNS] }, templates: { base: { poolSize: 0 }, 'code-interpreter-v1': { poolSize: 0 } } },
  env: { SSL_CERT_FILE: process.env.AIRLOCK_LAB_CA },
})
const N = 200, SIZE = 200e6, ROUNDS = 3
const secret = await Secret.create('bench-' + Date.now(), 'sk-' + 'x'.repeat(40))
try {
  const parse = (out) => out.trim().split(' ').map(Number)
  // other.test has no rules; allowed.test has one.
  const sbx = await Sandbox.create({
    timeoutMs: 900_000,
    network: { rules: { 'allowed.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(secret.name)}` } } }] } },
  })
  await sbx.files.write('/home/user/client.py', client)
  await sbx.files.write('/home/user/lab-ca.pem', readFileSync(process.env.AIRLOCK_LAB_CA, 'utf8'))
  const addr = { 'allowed.test': '203.0.113.10', 'other.test': '203.0.113.30' }
  const inSandbox = async (host, ca) => parse((await sbx.commands.run(`python3 /home/user/client.py ${host} ${addr[host]} ${N} ${SIZE} ${ca}`, { timeoutMs: 600_000 })).stdout)
  const runs = { bare: [], plain: [], intercepted: [] }
  await inSandbox('allowed.test', '-') // warm: the leaf certificate, the pins
  for (let i = 0; i < ROUNDS; i++) {
    runs.bare.push(parse(execFileSync('/usr/bin/python3', [join(dir, 'client.py'), 'allowed.test', addr['allowed.test'], N, SIZE, process.env.AIRLOCK_LAB_CA]).toString()))
    runs.plain.push(await inSandbox('other.test', '/home/user/lab-ca.pem'))
    runs.intercepted.push(await inSandbox('allowed.test', '-'))
  }
  await sbx.kill()
  const med = (rows, k) => rows.map((r) => r[k]).sort((a, b) => a - b)[Math.floor(rows.length / 2)]
  const ms = (x) => `${x.toFixed(2)} ms`
  console.log(`HTTPS egress (${process.env.AIRLOCK_TEST_BACKEND || 'namespaces'}), ${N} requests on fresh connections, then ${SIZE / 1e6} MB; medians of ${ROUNDS} rounds`)
  const base = runs.bare
  for (const [name, rows] of [['host straight to the server', runs.bare], ['sandbox, proxy relays TLS', runs.plain], ['sandbox, proxy intercepts', runs.intercepted]]) {
    const [p50, p99, mbs] = [0, 1, 2].map((k) => med(rows, k))
    console.log(`  ${name.padEnd(29)} p50 ${ms(p50).padStart(9)} (${(p50 / med(base, 0)).toFixed(2)}x)  p99 ${ms(p99).padStart(9)}  download ${mbs.toFixed(0).padStart(5)} MB/s (${(mbs / med(base, 2)).toFixed(2)}x)`)
  }
} finally {
  await Secret.destroy(secret.secretId).catch(() => {})
  await server.stop()
  rmSync(dir, { recursive: true, force: true })
}
