// The escape catalogue: attacks that code in a sandbox tries, each row with
// the observation, made on the host wherever there is one to make, that
// proves it failed. One table, run on the backend under test
// (AIRLOCK_TEST_BACKEND) through every way code gets in: the E2B SDK
// against airlock serve (commands.run as the sandbox's user), the one-shot
// `airlock run`, and, as the sandbox's root, the SDK in a sandbox of a
// template made from an image (a Debian root, AIRLOCK_DEBIAN_ROOT, which
// make test makes): root of the sandbox's own user namespace, or of
// gVisor's kernel, is still nobody on the host. Rows marked api are
// attacks on the API itself.
// SECURITY.md lists what the rows cover; the figures of a run are printed
// at the end.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFile, spawn } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { chmodSync, existsSync, lstatSync, mkdtempSync, readFileSync, readdirSync, rmSync, statfsSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { Sandbox, Template } from 'e2b'
import { startServer, sleep } from './harness.mjs'

const bin = resolve(import.meta.dirname, '../../bin/airlock')
const backend = process.env.AIRLOCK_TEST_BACKEND ?? 'namespaces'
const gvisor = backend === 'gvisor'

// What the host holds that no sandbox may read, write, signal or reach.
const h = {
  secret: 'host-secret-' + randomBytes(12).toString('hex'),
  canary: 'daemon-env-' + randomBytes(12).toString('hex'),
  dir: mkdtempSync(join(tmpdir(), 'airlock-escape-')),
  marker: 'escmark' + randomBytes(6).toString('hex'),
}
let server, sbx, victim, tcp, unix, hostSock, cliState, registry, rootBox
const accepted = { tcp: 0, unix: 0, hostSock: 0 }
// Attacks per path: those that ran, and those of them that held.
const ran = { api: 0, cli: 0, root: 0 }
const stood = { api: 0, cli: 0, root: 0 }
const rootTemplate = 'escape-root'
const noRoot = !process.env.AIRLOCK_DEBIAN_ROOT && 'the root path needs a Debian root in AIRLOCK_DEBIAN_ROOT (make test makes one)'

// hostFacts are read before and after every attack: none may change.
const hostFacts = () => {
  const read = (p) => { try { return readFileSync(p, 'utf8') } catch { return null } }
  const facts = {}
  for (const p of ['/proc/sys/kernel/core_pattern', '/proc/sys/kernel/modprobe', '/proc/sys/kernel/hostname',
    '/proc/sys/vm/overcommit_memory', '/sys/kernel/mm/ksm/run', '/sys/kernel/mm/transparent_hugepage/enabled']) facts[p] = read(p)
  if (existsSync('/sys/fs/cgroup')) {
    for (const c of readdirSync('/sys/fs/cgroup')) {
      const p = `/sys/fs/cgroup/${c}/release_agent`
      if (existsSync(p)) facts[p] = read(p)
    }
  }
  // The binaries: airlock, runsc, and the sandbox binary as installed for
  // the daemon's backends and for airlock run.
  const installed = [join(server.stateDir, 'run'), join(server.stateDir, 'gvisor'), '/run/airlock']
    .flatMap((d) => existsSync(d) ? readdirSync(d).filter((f) => f.startsWith('airlock-sandbox-')).map((f) => join(d, f)) : [])
  for (const b of [bin, resolve(bin, '../runsc'), ...installed]) {
    if (existsSync(b)) facts[b] = createHash('sha256').update(readFileSync(b)).digest('hex')
  }
  // The image's files, shared read-only by every sandbox of its template:
  // its root writes only in a layer of its own.
  for (const f of h.layerFiles ?? []) facts[f] = createHash('sha256').update(readFileSync(f)).digest('hex')
  facts.hostDir = readdirSync(h.dir).sort().join(',')
  facts.mounts = read('/proc/self/mountinfo').includes(h.marker)
  return facts
}

before(async () => {
  // Everything the host offers, world-readable and world-writable, so
  // that only isolation, not permissions, keeps the sandbox out.
  chmodSync(h.dir, 0o777)
  writeFileSync(join(h.dir, 'secret'), h.secret + '\n', { mode: 0o644 })
  chmodSync(join(h.dir, 'secret'), 0o644)
  victim = spawn('sleep', ['3600'], { stdio: 'ignore' })
  tcp = createServer((c) => { accepted.tcp++; c.destroy() })
  await new Promise((ok) => tcp.listen(0, '127.0.0.1', ok))
  h.port = tcp.address().port
  h.abstract = 'airlock-escape-' + randomBytes(6).toString('hex')
  unix = createServer((c) => { accepted.unix++; c.destroy() })
  await new Promise((ok) => unix.listen('\0' + h.abstract, ok))
  // A host socket by path, as a container runtime's is: the daemon (root)
  // must never be made to dial it.
  h.sock = join(h.dir, 'runtime.sock')
  hostSock = createServer((c) => { accepted.hostSock++; c.destroy() })
  await new Promise((ok) => hostSock.listen(h.sock, ok))
  // The daemon's environment holds the canary (and its API key).
  process.env.AIRLOCK_ESCAPE_CANARY = h.canary
  // The Debian image comes from a registry on loopback, which a server
  // pulls from only when its operator lists its address. The server is
  // sealed (network.default "none"), so that its sandboxes can be saved,
  // snapshotted and forked, which those with a network (the E2B API's
  // default elsewhere) cannot yet: the catalogue tries all of it.
  // Networked sandboxes' escapes are network.test.mjs's. Its base is the
  // jail (stock.root "jail"): the user path tries what a sandbox's user
  // alone can do, and the stock machines' user, who has sudo, is root of
  // the sandbox, which the root path tries.
  server = await startServer(['--pool-size', '0'], {
    config: { builds: { registryAddresses: ['127.0.0.1'], disk: '512M' }, network: { default: 'none' }, stock: { root: 'jail' } },
  })
  // The shared sandboxes live as long as the whole catalogue may take.
  sbx = await Sandbox.create({ timeoutMs: 3_600_000 })
  if (!noRoot) {
    registry = spawn(resolve(bin, '../mkimage'), ['-root', process.env.AIRLOCK_DEBIAN_ROOT], { stdio: ['pipe', 'pipe', 'inherit'] })
    const addr = await new Promise((ok, fail) => {
      registry.on('exit', (code) => fail(new Error(`mkimage exited with ${code}`)))
      createInterface({ input: registry.stdout }).on('line', (l) => { if (l.startsWith('REGISTRY=')) ok(l.slice(9)) })
    })
    await Template.build(Template().fromImage(`${addr}/debian:latest`), rootTemplate)
    rootBox = await Sandbox.create(rootTemplate, { timeoutMs: 3_600_000 })
    h.layerFiles = imageFiles(server.stateDir, ['usr/bin/python3.11', 'usr/bin/bash', 'usr/lib/x86_64-linux-gnu/libc.so.6', 'etc/passwd'])
    assert.ok(h.layerFiles.length >= 3, `the image's files in the store: ${h.layerFiles}`)
  }
  cliState = mkdtempSync(join(tmpdir(), 'airlock-escape-cli-'))
  // airlock run installs its sandbox binary at its first run: before the
  // host's facts are taken.
  assert.equal((await paths.cli('echo ready')).stdout, 'ready\n')
  h.before = hostFacts()
})

after(async () => {
  await sbx?.kill().catch(() => {})
  await rootBox?.kill().catch(() => {})
  registry?.stdin.end()
  const { code, leftover } = await server.stop()
  victim.kill('SIGKILL')
  tcp.close()
  unix.close()
  hostSock.close()
  rmSync(h.dir, { recursive: true, force: true })
  rmSync(cliState, { recursive: true, force: true })
  delete process.env.AIRLOCK_ESCAPE_CANARY
  console.log(`escape catalogue on ${backend}: held ${stood.api} of ${ran.api} attacks through the API, ${stood.cli} of ${ran.cli} through airlock run, ${stood.root} of ${ran.root} as the sandbox's root`)
  assert.equal(code, 0)
  assert.deepEqual(leftover, [])
})

// Each way in runs a bash script and returns what it printed.
const paths = {
  async api(script, opts = {}) {
    const box = opts.box ?? sbx
    try {
      const r = await box.commands.run(script, { timeoutMs: opts.timeoutMs ?? 60_000, user: opts.user })
      return { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode }
    } catch (err) {
      return { stdout: err.stdout ?? '', stderr: (err.stderr ?? '') + String(err), exitCode: err.exitCode ?? -1 }
    }
  },
  // As the root of a sandbox of an image: the SDK's user 'root'.
  async root(script, opts = {}) {
    return paths.api(script, { ...opts, box: opts.box ?? rootBox, user: 'root' })
  },
  cli(script, opts = {}) {
    const args = ['run', '--backend', backend, '--state-dir', cliState, '--timeout', `${(opts.timeoutMs ?? 60_000) / 1000}s`, '--', '/bin/bash', '-c', script]
    return new Promise((ok) => execFile(bin, args, { maxBuffer: 64 << 20, env: { ...process.env } }, (err, stdout, stderr) => {
      ok({ stdout, stderr, exitCode: err ? (err.code ?? -1) : 0 })
    }))
  },
}

// refused asserts the attack printed none of the words that mean it
// worked, and that the host's secrets appear nowhere in its output.
function held(out, ...words) {
  const all = out.stdout + out.stderr
  for (const w of [h.secret, h.canary, server.apiKey, ...words]) {
    assert.ok(!all.includes(w), `the sandbox got ${JSON.stringify(w)}:\n${all.slice(0, 2000)}`)
  }
}

// hangsAfter fails after ms, naming what hung; its timer does not keep
// the test's process alive.
const hangsAfter = (ms, what) => new Promise((_, fail) => setTimeout(() => fail(new Error(`${what} hung`)), ms).unref())

// A python3 script, inside the bash script.
const py = (code) => `python3 - <<'PYEOF'\n${code}\nPYEOF\n`

const catalogue = [
  {
    name: 'host files: read and write a world-readable, world-writable host directory',
    script: () => `cat ${h.dir}/secret; echo x > ${h.dir}/pwned-$$; ls ${h.dir};
      cat /proc/1/root${h.dir}/secret /proc/self/root${h.dir}/secret;
      find / -xdev -name secret -path '*airlock-escape*' 2>/dev/null | xargs -r cat; true`,
    check: (out) => held(out),
  },
  {
    name: "the daemon's environment (a canary and the API key) is not readable",
    script: () => `env; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null;
      cat /proc/1/environ /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n'; true`,
    check: (out) => held(out),
  },
  {
    name: 'host processes: invisible and unkillable',
    script: () => `ps -eo pid,user,args 2>/dev/null || ls /proc; kill -9 ${victim.pid}; kill -9 -1; kill -9 1; true`,
    fresh: true, // kill -1 takes the sandbox's own processes with it
    check: (out) => {
      held(out, `sleep 3600`)
      assert.doesNotThrow(() => process.kill(victim.pid, 0), 'the host process survived')
    },
  },
  {
    name: "the host's loopback and abstract unix sockets are out of reach",
    script: () => py(`import socket
for fam, addr in ((socket.AF_INET, ("127.0.0.1", ${h.port})), (socket.AF_UNIX, "\\0${h.abstract}")):
    s = socket.socket(fam)
    s.settimeout(2)
    try:
        s.connect(addr); print("CONNECTED", fam)
    except OSError as e:
        print("refused", fam, e)`),
    check: (out) => {
      held(out, 'CONNECTED')
      assert.deepEqual(accepted, { tcp: 0, unix: 0, hostSock: 0 }, 'the host accepted no connection')
    },
  },
  {
    name: '/proc/self/exe and the runtime binary cannot be overwritten (CVE-2019-5736)',
    script: () => py(`import glob
for p in ["/proc/self/exe", "/proc/1/exe"] + glob.glob("/proc/[0-9]*/exe"):
    for mode in ("r+b", "wb", "ab"):
        try:
            with open(p, mode) as f: f.write(b"#!/bin/sh\\n"); print("WROTE", p)
        except OSError as e:
            pass
print("done")`),
    check: (out) => { held(out, 'WROTE'); assert.match(out.stdout, /done/) },
    // The sandbox's root may write its own files, which on gVisor include
    // a running program (gVisor has no ETXTBSY: python3 rewrote itself and
    // died of SIGBUS). What proves the row: the runtime's binaries and the
    // image's layers on the host are unchanged (hostFacts), in a sandbox
    // of its own (fresh) so that the next rows have their python3.
    asRoot: (out) => held(out),
    fresh: true,
  },
  {
    name: 'leaked descriptors and working directories name nothing of the host',
    script: () => `for f in /proc/self/fd/* /proc/1/fd/* /proc/$PPID/fd/*; do readlink $f; done 2>/dev/null;
      readlink /proc/self/cwd /proc/1/cwd /proc/1/root; ls /proc/1/cwd/ /proc/1/root/ 2>&1; true`,
    check: (out) => held(out, server.stateDir, h.dir, cliState),
  },
  {
    name: 'raw and packet sockets are refused',
    script: () => py(`import socket
for fam, kind, proto in ((socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), (socket.AF_PACKET, socket.SOCK_RAW, 0x0300), (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)):
    try:
        socket.socket(fam, kind, proto); print("OPENED", fam)
    except OSError as e:
        print("refused", fam, e)`),
    check: (out) => held(out, 'OPENED'),
    // The sandbox's root keeps NET_RAW, as in a container runtime's
    // defaults: IP raw sockets open, in the sandbox's own network
    // namespace (loopback only, or its veth). Packet sockets never.
    asRoot: (out) => held(out, 'OPENED 17'),
  },
  {
    name: 'mount, unshare, setns and chroot fail, and no mount reaches the host',
    script: () => `mkdir -p /tmp/m; mount -t tmpfs ${h.marker} /tmp/m && echo MOUNTED;
      unshare -Urm sh -c 'mount -t tmpfs ${h.marker} /tmp/m && echo MOUNTED_IN_USERNS';
      unshare -Urn true && echo UNSHARED; nsenter -t 1 -m -u -n true && echo ENTERED; chroot / true && echo CHROOTED;
      ${py(`import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000 | 0x00020000) == 0: print("UNSHARED_RAW")
fd = os.open("/proc/1/ns/mnt", os.O_RDONLY)
if libc.setns(fd, 0) == 0: print("SETNS")`)} true`,
    // gVisor's Sentry has namespaces of its own: a user namespace, and a
    // mount in it, are the Sentry's, and the host's mount table (checked
    // after every row) shows nothing.
    check: (out) => held(out, 'MOUNTED\n', 'ENTERED', 'CHROOTED', 'SETNS', ...(gvisor ? [] : ['MOUNTED', 'UNSHARED'])),
    // The root of gVisor's sandbox keeps SYS_CHROOT, in gVisor's kernel
    // (on namespaces the filter refuses chroot to everyone).
    asRoot: (out) => held(out, 'MOUNTED\n', 'ENTERED', 'SETNS', ...(gvisor ? [] : ['MOUNTED', 'UNSHARED', 'CHROOTED'])),
  },
  {
    name: 'setuid binaries and root give nothing (no_new_privs)',
    script: () => `for f in $(find / -xdev -perm -4000 -type f 2>/dev/null | head -50); do echo "setuid: $f"; done;
      su -c 'echo BECAME_ROOT' root </dev/null 2>&1; sudo -n sh -c 'echo BECAME_ROOT' 2>&1;
      python3 -c 'import os; os.setuid(0); print("BECAME_ROOT")' 2>&1; grep -E 'NoNewPrivs|CapEff' /proc/self/status; true`,
    check: (out) => {
      held(out, 'BECAME_ROOT')
      assert.match(out.stdout, /CapEff:\s+0+\n/, 'no capabilities')
      if (!gvisor) assert.match(out.stdout, /NoNewPrivs:\s+1/)
    },
    // Root of the sandbox is root already, with a container's default
    // capabilities in its own user namespace (or gVisor's kernel) and
    // none that reaches further: no SYS_ADMIN, SYS_MODULE, SYS_PTRACE,
    // NET_ADMIN, DAC_READ_SEARCH, SYS_RAWIO, BPF …
    asRoot: (out) => {
      held(out)
      const eff = BigInt('0x' + /CapEff:\s+([0-9a-f]+)/.exec(out.stdout)[1])
      // CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP
      // NET_BIND_SERVICE NET_RAW SYS_CHROOT SETFCAP, and on gVisor MKNOD
      // and AUDIT_WRITE (its own kernel's).
      const allowed = [0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 31, ...(gvisor ? [27, 29] : [])].reduce((m, c) => m | (1n << BigInt(c)), 0n)
      assert.equal(eff & ~allowed, 0n, `capabilities beyond a container's defaults: CapEff ${eff.toString(16)}`)
      if (!gvisor) assert.match(out.stdout, /NoNewPrivs:\s+1/)
    },
  },
  {
    name: '/proc/sys, /proc/sysrq-trigger and /sys are not writable (core_pattern, modprobe)',
    script: () => `echo '|/tmp/evil %p' > /proc/sys/kernel/core_pattern && echo WROTE_CORE;
      echo /tmp/evil > /proc/sys/kernel/modprobe && echo WROTE_MODPROBE;
      echo 2 > /proc/sys/vm/overcommit_memory && echo WROTE_VM;
      echo h > /proc/sysrq-trigger && echo WROTE_SYSRQ;
      echo 1 > /sys/kernel/mm/ksm/run && echo WROTE_SYS; mount -t sysfs sys /tmp && echo MOUNTED_SYSFS; true`,
    check: (out) => held(out, 'WROTE_', 'MOUNTED_SYSFS'),
  },
  {
    name: "cgroup release_agent cannot be set (the classic v1 escape)",
    script: () => `mkdir -p /tmp/cg; for c in rdma memory cpu pids; do mount -t cgroup -o $c cgroup /tmp/cg && echo MOUNTED_CG; done;
      unshare -Urm sh -c 'mount -t cgroup -o rdma cgroup /tmp/cg && echo MOUNTED_CG';
      mountpoint -q /tmp/cg && echo MOUNTED_CG;
      for f in /sys/fs/cgroup/*/release_agent /sys/fs/cgroup/release_agent; do echo /tmp/evil > $f 2>/dev/null && echo WROTE_AGENT $f; done;
      echo 1 > /sys/fs/cgroup/notify_on_release 2>/dev/null && echo WROTE_NOTIFY; true`,
    check: (out) => held(out, 'MOUNTED_CG', 'WROTE_AGENT', 'WROTE_NOTIFY'),
  },
  {
    name: 'dangerous syscalls: bpf, perf_event_open, keyctl, userfaultfd, io_uring, modules, kexec, ptrace',
    script: () => py(`import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
calls = {"bpf": (321, 0, 0, 0), "perf_event_open": (298, 0, 0, -1, -1, 0), "keyctl": (250, 0, 0, 0, 0, 0),
         "add_key": (248, 0, 0, 0, 0, 0), "userfaultfd": (323, 0), "io_uring_setup": (425, 1, 0),
         "init_module": (175, 0, 0, 0), "finit_module": (313, -1, 0, 0), "delete_module": (176, 0, 0),
         "kexec_load": (246, 0, 0, 0, 0), "kexec_file_load": (320, -1, -1, 0, 0, 0),
         "ptrace_attach_1": (101, 16, 1, 0, 0), "process_vm_readv_1": (310, 1, 0, 0, 0, 0, 0),
         "open_by_handle_at": (304, 0, 0, 0), "iopl": (172, 3), "reboot": (169, 0, 0, 0, 0), "swapon": (167, 0, 0)}
for name, (nr, *args) in calls.items():
    r = libc.syscall(nr, *args)
    print(name, "SUCCEEDED" if r != -1 else errno.errorcode.get(ctypes.get_errno(), "?"))`),
    check: (out) => {
      // The Sentry answers for itself on gVisor: keyctl's session keyring
      // is gVisor's own, not the host's. Everything else fails on both.
      // process_vm_readv of pid 1 reads a task of the same Sentry.
      const sentryOwn = gvisor ? new Set(['keyctl', 'add_key', 'process_vm_readv_1']) : new Set()
      const lines = out.stdout.trim().split('\n')
      assert.ok(lines.length >= 17, out.stdout + out.stderr)
      for (const line of lines) {
        const [name, result] = line.split(' ')
        if (!sentryOwn.has(name)) assert.notEqual(result, 'SUCCEEDED', line)
      }
    },
  },
  {
    name: 'the 32-bit ABI (int 0x80) gets no syscall through',
    script: () => py(`import ctypes, mmap, os, sys
# getpid through int 0x80: mov eax, 20; int 0x80; ret
code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
f = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
sys.stdout.flush()
r = f()
print("INT80_RETURNED", r, "pid", os.getpid())`) + '; echo "exit=$?"',
    check: (out) => {
      // Killed (namespaces' filter) or refused (gVisor, or a host kernel
      // without the ABI): never the pid.
      const m = /INT80_RETURNED (-?\d+) pid (\d+)/.exec(out.stdout)
      if (m) assert.notEqual(m[1], m[2], 'getpid through int 0x80 answered')
    },
  },
  {
    name: 'devices: no disk, memory or kernel log, and mknod gives none',
    script: () => `ls /dev; for d in /dev/mem /dev/kmem /dev/port /dev/kmsg /dev/sda /dev/vda /dev/nvme0n1 /dev/fuse /dev/kvm /dev/net/tun; do
        head -c 16 $d >/dev/null 2>&1 && echo "READ $d"; done;
      mknod /tmp/sda b 8 0 && head -c 16 /tmp/sda >/dev/null && echo READ_MKNOD;
      mknod /tmp/mem c 1 1 && head -c 16 /tmp/mem >/dev/null && echo READ_MKNOD; true`,
    check: (out) => held(out, 'READ '),
  },
  {
    name: "the agent's socket swapped for a link to a host socket: the daemon dials no host socket",
    api: true,
    fresh: true,
    async attack(box) {
      // On gVisor the agent listens in a directory the sandbox writes (the
      // namespaces backend hands it a descriptor: there is nothing to swap).
      // As user, and as root where there is a root (whose agent directory
      // is root's: user cannot swap it there).
      const tries = [[box, undefined]]
      if (rootBox) tries.push([await Sandbox.create(rootTemplate), 'root'], [await Sandbox.create(rootTemplate), undefined])
      try {
        for (const [b, user] of tries) {
          const swap = await b.commands.run(`cd /.airlock/run 2>/dev/null || exit 0; mv agent.sock moved && ln -s ${h.sock} agent.sock && echo SWAPPED;
            ln -s ${h.sock} other.sock; mkfifo fifo; ls -la; true`, { user }).catch((e) => e)
          if (gvisor && b === box) assert.match(swap.stdout, /SWAPPED/, 'the swap itself works as user in base')
          // Requests that need new connections to the agent: many at once.
          await Promise.allSettled(Array.from({ length: 24 }, (_, i) => i % 2 ? b.files.read('/etc/hostname') : b.commands.run('true')))
          await b.commands.run('true').catch(() => {})
          assert.equal(accepted.hostSock, 0, `the daemon dialled the host socket (${user ?? 'user'})`)
        }
      } finally {
        for (const [b] of tries.slice(1)) await b.kill().catch(() => {})
      }
      assert.equal(await (await fetch(`${process.env.E2B_API_URL}/health`)).text(), 'ok\n')
    },
  },
  {
    name: 'a daemonized, SIGTERM-ignoring process dies with its sandbox',
    api: true,
    async attack() {
      // The server keeps no pool: the daemon's descendants change only
      // with the sandboxes this suite makes.
      const before = descendants(server.pid).length
      const box = await Sandbox.create()
      const survivor = `sleep 4141.${h.marker.length}`
      await box.commands.run(`setsid sh -c 'trap "" TERM HUP; exec ${survivor}' >/dev/null 2>&1 &`, { background: true })
      await sleep(300)
      assert.match((await paths.api('ps -eo args', { box })).stdout, new RegExp(survivor.replace('.', '\\.')))
      // On gVisor the survivor is a task of the Sentry, not of the host.
      if (!gvisor) assert.ok(hostProcesses(survivor) > 0, 'the survivor runs before the kill')
      assert.ok(descendants(server.pid).length > before)
      await box.kill()
      for (let i = 0; i < 100 && (hostProcesses(survivor) > 0 || descendants(server.pid).length > before); i++) await sleep(100)
      assert.equal(hostProcesses(survivor), 0, 'nothing of the sandbox outlives it')
      assert.equal(descendants(server.pid).length, before, "every host process of the sandbox is gone")
    },
  },
  {
    name: "a command's timeout kills it even when it ignores SIGTERM",
    api: true,
    async attack(box) {
      const out = await paths.api(`trap '' TERM; sleep 4242.${h.marker.length}`, { box, timeoutMs: 1500 })
      assert.notEqual(out.exitCode, 0)
      for (let i = 0; i < 100 && hostProcesses(`sleep 4242.${h.marker.length}`) > 0; i++) await sleep(100)
      assert.equal(hostProcesses(`sleep 4242.${h.marker.length}`), 0)
    },
  },
  {
    name: 'other sandboxes: their files, processes and memory are out of reach',
    api: true,
    async attack() {
      const other = await Sandbox.create()
      try {
        const theirs = 'their-secret-' + randomBytes(8).toString('hex')
        await other.files.write('/home/user/their-secret', theirs)
        await other.commands.run(`sleep 4343.${h.marker.length}`, { background: true })
        for (const path of Object.keys(paths)) {
          const out = await paths[path](`find / -xdev -name their-secret 2>/dev/null | xargs -r cat;
            grep -l '434[3]' /proc/[0-9]*/cmdline 2>/dev/null && echo SAW_THEIR_PROCESS;
            for p in /proc/[0-9]*; do grep -q '434[3]' $p/cmdline 2>/dev/null && kill -9 \${p#/proc/}; done; true`)
          held(out, theirs, 'SAW_THEIR_PROCESS')
        }
        assert.equal(await other.files.read('/home/user/their-secret'), theirs)
        const procs = await other.commands.list()
        assert.ok(procs.some((p) => p.args?.join(' ').includes('4343') || p.cmd?.includes('sleep')), 'their process lives')
      } finally {
        await other.kill()
      }
    },
  },
  {
    name: 'files API: traversal and symlinks resolve inside the sandbox only',
    api: true,
    async attack(box) {
      await box.commands.run('ln -s / /home/user/root; ln -s /proc/1/root /home/user/p1; ln -s ../../.. /home/user/up')
      const reads = [`${h.dir}/secret`, `../../../..${h.dir}/secret`, `/proc/1/root${h.dir}/secret`,
        `/home/user/root${h.dir}/secret`, `/home/user/p1${h.dir}/secret`, `/home/user/up${h.dir}/secret`]
      for (const p of reads) {
        const got = await box.files.read(p).catch((e) => String(e))
        assert.ok(!got.includes(h.secret), `files.read(${p}) returned the host's secret`)
      }
      for (const p of [`${h.dir}/pwned-api`, `../../../..${h.dir}/pwned-api`, `/home/user/root${h.dir}/pwned-api`, `/home/user/up${h.dir}/pwned-api`]) {
        await box.files.write(p, 'x').catch(() => {})
      }
      const listed = await box.files.list(`/home/user/p1${h.dir}`).catch(() => [])
      assert.ok(!listed.some((e) => e.name === 'secret'), 'files.list showed the host directory')
      // A race: a symlink swapped between the sandbox's own /tmp and / as
      // fast as it can while files are written through it.
      await box.commands.run(`while :; do ln -sfn / /home/user/flip; ln -sfn /tmp /home/user/flip; done`, { background: true })
      for (let i = 0; i < 40; i++) await box.files.write(`/home/user/flip${h.dir}/pwned-race`, 'x').catch(() => {})
      assert.ok(!readdirSync(h.dir).some((f) => f.startsWith('pwned')), 'a host file was written')
    },
  },
  {
    name: 'files API: watchDir sees nothing of the host',
    api: true,
    async attack(box) {
      const events = []
      const w = await box.files.watchDir(`/proc/1/root${h.dir}`, (e) => events.push(e)).catch(() => null)
      writeFileSync(join(h.dir, 'touched'), 'x')
      await sleep(500)
      await w?.stop()
      rmSync(join(h.dir, 'touched'))
      assert.deepEqual(events.filter((e) => e.name?.includes('touched')), [])
    },
  },
  {
    name: "tokens: another sandbox's, a gone sandbox's, a guessed one",
    api: true,
    async attack(box) {
      const other = await Sandbox.create()
      const gone = await Sandbox.create()
      await gone.kill()
      const envd = (id, token) => fetch(process.env.E2B_SANDBOX_URL + '/health', {
        headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': '49983', ...(token ? { 'X-Access-Token': token } : {}) },
      }).then((r) => r.status)
      try {
        const tokenOf = async (s) => (await (await fetch(`${process.env.E2B_API_URL}/sandboxes/${s.sandboxId}`, { headers: { 'X-API-KEY': server.apiKey } })).json()).envdAccessToken
        const mine = await tokenOf(box)
        assert.equal(await envd(other.sandboxId, mine), 401, "another sandbox's token")
        assert.equal(await envd(other.sandboxId, server.apiKey), 401, 'the API key is not a sandbox token')
        assert.equal(await envd(gone.sandboxId, mine), 401, 'a gone sandbox, probed with a token not its own')
        assert.equal(await envd('i' + randomBytes(10).toString('hex').slice(0, 19), mine), 401, 'an id never issued')
        assert.equal(await envd(box.sandboxId, mine.slice(0, -1) + (mine.endsWith('0') ? '1' : '0')), 401, 'a token off by one digit')
        assert.equal(await envd(box.sandboxId, mine), 204)
      } finally {
        await other.kill()
      }
    },
  },
  {
    name: 'oversized and malformed requests and frames: a clear 4xx, and the daemon stays well',
    api: true,
    async attack(box) {
      const api = process.env.E2B_API_URL
      const key = { 'X-API-KEY': server.apiKey, 'Content-Type': 'application/json' }
      const big = await fetch(`${api}/sandboxes`, { method: 'POST', headers: key, body: '{"metadata":{"a":"' + 'x'.repeat(32 << 20) + '"}}' })
      assert.ok(big.status >= 400 && big.status < 500, `a 32 MiB create body: ${big.status}`)
      for (const body of ['{', '[]', '{"templateID": 5}', '{"timeout": "x"}', '\u0000\u0001', '{"metadata": {"a": {"b": 1}}}']) {
        const r = await fetch(`${api}/sandboxes`, { method: 'POST', headers: key, body })
        assert.equal(r.status, 400, `create with ${JSON.stringify(body)}: ${r.status}`)
        const msg = (await r.json()).message
        assert.ok(!msg.includes('\n') && !msg.includes(server.stateDir), msg)
      }
      // Connect frames: a length of 4 GiB, a truncated frame, garbage.
      const tokenRes = await fetch(`${api}/sandboxes/${box.sandboxId}`, { headers: key })
      const token = (await tokenRes.json()).envdAccessToken
      const frame = (len, payload) => Buffer.concat([Buffer.from([0, len >>> 24 & 255, len >>> 16 & 255, len >>> 8 & 255, len & 255]), Buffer.from(payload)])
      for (const body of [frame(0xffffffff, '{}'), frame(100, '{"process"'), Buffer.from('garbage'), frame(2, '{]')]) {
        const r = await fetch(`${process.env.E2B_SANDBOX_URL}/process.Process/Start`, {
          method: 'POST', body,
          headers: { 'E2b-Sandbox-Id': box.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': token, 'Content-Type': 'application/connect+json' },
        })
        const text = await r.text()
        assert.ok(r.status < 500 || r.status === 200, `a bad frame: ${r.status} ${text.slice(0, 200)}`)
        assert.ok(!text.includes('"exitCode":0') && !text.includes(server.stateDir), text.slice(0, 200))
      }
      assert.equal((await paths.api('echo still here', { box })).stdout, 'still here\n')
      assert.equal(await (await fetch(`${api}/health`)).text(), 'ok\n')
    },
  },
  {
    name: 'exhaustion: a fork bomb, memory, disk and inodes stay in their sandbox',
    api: true,
    async attack() {
      // [script, what its output says, whether its sandbox lives on]
      const bombs = {
        // The agent keeps tasks of its own beyond the pids limit
        // (agentproto.AgentTasks): the bomb gets EAGAIN and the agent,
        // which cannot live without starting threads, answers on.
        'fork bomb': [`bomb() { bomb | bomb & }; bomb; sleep 5; echo BOMBED`, /BOMBED|Resource temporarily unavailable|retry/, true],
        memory: [py(`x = []\nwhile True: x.append(bytearray(64 << 20))`), /killed|MemoryError|exit status 137/i],
        // Writable space is memory (tmpfs), bounded below the memory limit
        // (policy.WritableBytes): with the defaults, a disk limit above
        // the memory limit, the writer gets ENOSPC, not an OOM kill.
        disk: [`dd if=/dev/zero of=/tmp/fill bs=1M 2>&1 | head -1`, /No space left/, true],
        inodes: [py(`import os, time
os.makedirs("/tmp/inodes", exist_ok=True)
end, n = time.time() + 15, 0
try:
    while time.time() < end:
        open(f"/tmp/inodes/{n}", "w").close(); n += 1
    print("files", n, "in 15 s")
except OSError as e:
    print("stopped after", n, "files:", e)`), /stopped after|files \d+ in 15 s|killed/],
      }
      const other = await Sandbox.create()
      try {
        for (const [name, [script, outcome, lives]] of Object.entries(bombs)) {
          const box = await Sandbox.create()
          try {
            const run = paths.api(script, { box, timeoutMs: 45_000 })
            // The neighbour and the daemon keep answering meanwhile.
            for (let i = 0; i < 3; i++) assert.equal((await paths.api('echo fine', { box: other })).stdout, 'fine\n')
            assert.equal(await (await fetch(`${process.env.E2B_API_URL}/health`)).text(), 'ok\n')
            const out = await run
            const said = (out.stdout + out.stderr).trim().split('\n').slice(-2).join(' | ').slice(0, 160)
            console.log(`exhaustion, ${name}: ${said}`)
            assert.match(out.stdout + out.stderr, outcome, name)
            // Its agent answers (a command might not start: the bomb's
            // processes hold every task the user may have).
            if (lives) assert.equal(await box.files.exists('/tmp'), true, `the sandbox outlives its ${name}`)
          } finally {
            await box.kill()
          }
        }
      } finally {
        await other.kill()
      }
    },
  },
  {
    name: 'links, FIFOs, hard links and devices planted where the daemon works: pause, snapshot, fork, files-only pause, metrics, kill',
    api: true,
    timeout: 600_000, // many sandboxes and operations, each bounded
    async attack() {
      // Every place of a sandbox's that the daemon (root) or its agent
      // handles on its behalf, holding what would hurt a root that
      // followed or opened it: links to the host's secret, to its root and
      // to a host socket; FIFOs (an open blocks); a hard link; devices
      // (as root). On gVisor, a loop keeps swapping the agent's socket for
      // a link to the host socket while the daemon works.
      const plant = (root) => `cd /home/user; ln -sfn ${h.dir}/secret s-link; ln -sfn / root-link; ln -sfn /proc/1/root p1;
        ln -sfn ${h.sock} sock-link; mkfifo fifo /tmp/fifo; ln /home/user/s-link hard-link 2>/dev/null;
        ${root ? 'mknod dev c 1 3; mknod /tmp/disk b 8 0; mknod /tmp/zero c 0 0;' : ''}
        [ -w /.airlock/run ] && (while :; do mv -f /.airlock/run/agent.sock /.airlock/run/x 2>/dev/null; ln -sfn ${h.sock} /.airlock/run/agent.sock;
          mkfifo /.airlock/run/f 2>/dev/null; mv -f /.airlock/run/x /.airlock/run/agent.sock 2>/dev/null; sleep 0.01; done) >/dev/null 2>&1 &
        true`
      const within = (p, what) => Promise.race([p, hangsAfter(150_000, what)])
      // An operation may fail (its sandbox fights its own agent); it may
      // not hang, reach the host socket, or show the host's secret.
      const tryOp = async (what, op) => {
        try { return await within(op(), what) } catch (e) {
          if (/hung/.test(String(e))) throw e
          return null
        }
      }
      const boxes = [[await Sandbox.create(), undefined]]
      if (rootBox) boxes.push([await Sandbox.create(rootTemplate), 'root'])
      const made = []
      try {
        for (const [box, user] of boxes) {
          await box.commands.run(plant(user === 'root'), { user, background: false }).catch(() => {})
          await tryOp('metrics', () => box.getMetrics())
          for (let i = 0; i < 8; i++) await tryOp('files', () => box.files.read('/home/user/s-link')).then((d) => assert.ok(!String(d ?? '').includes(h.secret)))
          if (gvisor) {
            const snap = await tryOp('snapshot', () => box.createSnapshot())
            if (snap) made.push(await tryOp('create from the snapshot', () => Sandbox.create(snap.snapshotId)))
            const forks = await tryOp('fork', () => box.fork({ count: 1 }))
            if (forks) made.push(...forks)
            if (await tryOp('pause to disk', () => box.pause())) await tryOp('resume', () => Sandbox.connect(box.sandboxId))
          }
          if (user !== 'root') {
            // Files-only pause is for base and code-interpreter-v1.
            if (await tryOp('files-only pause', () => box.pause({ keepMemory: false }))) {
              const back = await tryOp('files-only resume', () => Sandbox.connect(box.sandboxId))
              if (back) {
                const out = await tryOp('read back', () => back.commands.run('readlink /home/user/s-link; cat /home/user/s-link; ls -la /home/user /tmp', { user }))
                if (out) held(out)
              }
            }
          }
          await tryOp('kill', () => box.kill())
        }
      } finally {
        for (const [box] of boxes) await box.kill().catch(() => {})
        for (const m of made) await m?.kill?.().catch(() => {})
      }
      assert.equal(accepted.hostSock, 0, 'the daemon dialled the host socket')
      assert.equal(await (await fetch(`${process.env.E2B_API_URL}/health`)).text(), 'ok\n')
    },
  },
  {
    name: "a build's writable layer, read back by the daemon, holding links, FIFOs, hard links, devices and sparse files",
    api: true,
    timeout: 600_000, // many sandboxes and operations, each bounded
    async attack() {
      if (!rootBox) return // needs the Debian image (AIRLOCK_DEBIAN_ROOT)
      const free = () => { const st = statfsSync(server.stateDir); return st.bavail * st.bsize }
      const before = free()
      // As root in the build's sandbox: whatever the read-back of its
      // layer could follow, block on or write out at full size.
      const plant = `mkdir -p /opt/p && cd /opt/p || exit 1; ln -s ${h.dir}/secret s-link; ln -s / root-link; ln -s ${h.sock} sock-link;
        mkfifo fifo; echo x > file; ln file hard; mknod zero c 0 0;
        for i in $(seq 40); do truncate -s 500M sparse$i || break; done; ls /opt/p | wc -l`
      const t = Template().fromTemplate(rootTemplate).runCmd(plant, { user: 'root' })
      const name = 'escape-readback-' + h.marker.slice(-6)
      let peak = 0
      const watch = setInterval(() => { peak = Math.max(peak, before - free()) }, 20)
      const built = await Promise.race([
        Template.build(t, name).then(() => 'built', (e) => `refused: ${String(e).split('\n')[0]}`),
        hangsAfter(300_000, 'the build').catch(() => 'hung'),
      ]).finally(() => clearInterval(watch))
      console.log(`build read-back: ${built}; the state directory's file system peaked ${(peak / 1048576).toFixed(0)} MiB above its start`)
      assert.notEqual(built, 'hung')
      // The layer's budget is the build's disk (builds.disk, 512M here):
      // the store may hold that much of the layer while it unpacks it.
      assert.ok(peak < (512 + 128) << 20, `the host's state directory took ${(peak / 1048576).toFixed(0)} MiB for a build's sparse files`)
      assert.equal(accepted.hostSock, 0)
      if (built === 'built') {
        // The layer holds the links as links: the daemon read nothing
        // through them, and a sandbox of it still sees none of the host.
        const box = await Sandbox.create(name)
        try {
          const out = await paths.api('readlink /opt/p/s-link; cat /opt/p/s-link; ls /opt/p | wc -l', { box })
          held(out)
        } finally {
          await box.kill()
        }
      }
    },
  },
  {
    name: 'exhaustion: every writable place fills up inside its sandbox, never the host',
    api: true,
    timeout: 600_000, // many sandboxes and operations, each bounded
    async attack() {
      // /tmp, the home, /dev/shm, the agent's directory (gVisor), and an
      // image's root (a new directory at /) as its root: each filled with
      // bytes until ENOSPC, then with 20,000 files. The state directory's file system may not
      // grow by more than a little (the daemon's own logs and state).
      const places = ['/tmp', '/home/user', '/dev/shm', '/.airlock/run']
      const fill = (dir) => `mkdir -p ${dir} 2>/dev/null; [ -w ${dir} ] || { echo "${dir}: not writable"; exit 0; }
        for i in $(seq 2048); do dd if=/dev/zero of=${dir}/fill$i bs=1M count=1 2>&1 || break; done | grep -o -m1 'No space left' || echo "${dir}: NOT FULL"
        i=0; while [ $i -lt 20000 ] && : > ${dir}/i$i 2>/dev/null; do i=$((i+1)); done; echo "${dir}: $i files"
        rm -f ${dir}/fill* ${dir}/i*`
      const free = () => { const st = statfsSync(server.stateDir); return st.bavail * st.bsize }
      const before = free()
      const boxes = [[await Sandbox.create(), undefined, places]]
      if (rootBox) boxes.push([await Sandbox.create(rootTemplate), 'root', [...places, '/fill-root', '/var/tmp']])
      try {
        for (const [box, user, dirs] of boxes) {
          for (const d of dirs) {
            const out = await paths.api(fill(d), { box, user, timeoutMs: 120_000 })
            console.log(`fill ${user ?? 'user'} ${d}: ${(out.stdout + out.stderr).trim().split('\n').slice(-2).join(' | ').slice(0, 160)}`)
            assert.match(out.stdout, /No space left|not writable/, `${d} filled without ENOSPC`)
            assert.ok(before - free() < 64 << 20, `the host's state directory lost ${((before - free()) / 1048576).toFixed(0)} MiB to ${d}`)
          }
          assert.equal(await box.files.exists('/tmp'), true, 'the sandbox outlives its full disks')
        }
      } finally {
        for (const [box] of boxes) await box.kill().catch(() => {})
      }
    },
  },
  {
    name: "an output flood streams: the daemon's memory does not hold it",
    api: true,
    async attack(box) {
      const rss = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${server.pid}/status`, 'utf8'))[1]) * 1024
      const before = rss()
      let bytes = 0
      await box.commands.run('head -c 100000000 /dev/zero | tr "\\0" x', { onStdout: (d) => { bytes += d.length }, timeoutMs: 90_000 })
      const grew = rss() - before
      console.log(`output flood: ${(bytes / 1e6).toFixed(0)} MB streamed, daemon RSS grew ${(grew / 1048576).toFixed(1)} MiB`)
      assert.ok(bytes >= 100e6 * 0.99, `${bytes} bytes arrived`)
      assert.ok(grew < 32 << 20, `the daemon grew ${grew} bytes`)
    },
  },
]

// imageFiles finds the files of names in the layers of the image store
// under stateDir.
function imageFiles(stateDir, names) {
  const found = []
  for (const d of readdirSync(stateDir)) {
    const layers = join(stateDir, d, 'layers')
    if (!existsSync(layers)) continue
    for (const l of readdirSync(layers)) {
      for (const n of names) {
        const f = join(layers, l, n)
        try { if (lstatSync(f).isFile()) found.push(f) } catch {}
      }
    }
  }
  return found
}

// descendants are the host processes below pid.
function descendants(pid) {
  const children = new Map()
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue
    try {
      const ppid = Number(readFileSync(`/proc/${p}/stat`, 'latin1').split(') ')[1].split(' ')[1])
      if (!children.has(ppid)) children.set(ppid, [])
      children.get(ppid).push(Number(p))
    } catch {}
  }
  const out = []
  for (let todo = [pid]; todo.length;) for (const c of children.get(todo.pop()) ?? []) { out.push(c); todo.push(c) }
  return out
}

// hostProcesses counts host processes whose command line contains s.
function hostProcesses(s) {
  let n = 0
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue
    try { if (readFileSync(`/proc/${pid}/cmdline`, 'latin1').replaceAll('\0', ' ').includes(s)) n++ } catch {}
  }
  return n
}

for (const row of catalogue) {
  for (const path of row.api ? ['api'] : ['api', 'cli', 'root']) {
    test(`${path}: ${row.name}`, { skip: path === 'root' && noRoot, timeout: row.timeout }, async () => {
      ran[path]++
      const fresh = row.fresh && path !== 'cli'
      const box = path === 'root' ? (fresh ? await Sandbox.create(rootTemplate) : rootBox) : (fresh ? await Sandbox.create() : sbx)
      try {
        if (row.attack) {
          await row.attack(box)
        } else {
          const out = await paths[path](row.script(), { box })
          ;(path === 'root' && row.asRoot ? row.asRoot : row.check)(out)
        }
      } finally {
        if (fresh) await box.kill().catch(() => {})
      }
      assert.deepEqual(hostFacts(), h.before, 'nothing of the host changed')
      assert.doesNotThrow(() => process.kill(victim.pid, 0), 'the host process lives')
      stood[path]++
    })
  }
}
