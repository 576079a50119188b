# Airlock. `make test` installs what the tests need and runs them all (as
# root for the sandbox tests); `make run` builds airlock and runs one
# sandboxed command.
SHELL := /bin/bash
GO ?= go
# Static: the same binary runs as the sandbox's init and, later, its agent.
export CGO_ENABLED := 0
BIN := bin/airlock
# What runs inside a sandbox (init, agent, sudo), embedded in airlock with
# its hash (package sandboxbin).
SANDBOX_BIN := internal/sandboxbin/bin/airlock-sandbox
# What airlock router and a node's cluster registration run: the only
# binary that links Kubernetes' client packages, embedded in airlock
# (package clusterbin).
CLUSTER_BIN := internal/clusterbin/bin/airlock-cluster
# A fake internet in network namespaces of the tests' own, in which the
# SDK suites run (tests/netlab).
NETLAB := bin/netlab
# gVisor's runsc, built from the Go module proxy (no prebuilt downloads
# here) at a pinned version, static as it must be.
RUNSC := bin/runsc
RUNSC_VERSION := v0.0.0-20260905035102-160fafc42237
export AIRLOCK_RUNSC := $(CURDIR)/$(RUNSC)

# Debian packages the default sandbox template is expected to provide
# (Python with numpy, pandas, matplotlib, seaborn, Pillow and its Jupyter
# kernel; R's), the C toolchain of go test -race (cgo), bubblewrap, the
# baseline of make bench-run, Chromium, which the console's tests drive,
# debootstrap, which makes the stock templates' Debian root, e2fsprogs,
# whose mkfs.ext4 makes volumes, and
# nss-myhostname, through which every client on the host resolves the
# sandboxes' getHost(port) names under localhost.
APT_PACKAGES := python3 bubblewrap e2fsprogs chromium python3-numpy python3-pandas python3-matplotlib python3-seaborn python3-pil python3-ipykernel r-cran-irkernel gcc libc6-dev iproute2 nftables busybox-static debootstrap libnss-myhostname

# The tests that need no root run again under the race detector as the
# user nobody (tests/as-nobody): those of every package with tests, as go
# list finds them, not a list kept by hand; tests that need root skip
# there (airlocktest.RequiresRoot). Left out: packages whose tests read
# the clone, which nobody may not reach (cmd/airlock builds the binary
# from it, internal/archtest parses it).
MODULE := github.com/airlock-sandbox/airlock
NEEDS_CLONE := cmd/airlock internal/archtest
UNPRIVILEGED = $(filter-out $(addprefix $(MODULE)/,$(NEEDS_CLONE)),$(shell $(GO) list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...))

.PHONY: all build console deps kernels stock runsc controlplane test test-go test-unprivileged test-sdk test-cluster run serve bench bench-run bench-serve bench-net bench-template bench-stock bench-reliability bench-density bench-pause bench-cluster bench-tti bench-volumes bench-live bench-egress fuzz clean

all: build

# The web console (console/: Vite, TypeScript, Preact, the E2B SDKs),
# built into the package that embeds it.
CONSOLE_DIST := internal/console/dist

console:
	cd console && npm ci --no-audit --no-fund >/dev/null
	rm -rf $(CONSOLE_DIST)/assets $(CONSOLE_DIST)/index.html
	cd console && npm run --silent build >/dev/null

build: console
	$(GO) build -trimpath -o $(SANDBOX_BIN) ./cmd/airlock-sandbox
	sha256sum $(SANDBOX_BIN) | cut -d' ' -f1 > $(SANDBOX_BIN).sha256
	$(GO) build -trimpath -o $(CLUSTER_BIN) ./cmd/airlock-cluster
	$(GO) build -trimpath -o $(BIN) ./cmd/airlock
	$(GO) build -trimpath -o $(NETLAB) ./tests/netlab
	$(GO) build -trimpath -o bin/mkimage ./tests/mkimage

# The code interpreter's kernels beyond Debian's Python and R ones, where
# every sandbox that sees the host's /usr finds them: Deno's (JavaScript
# and TypeScript, from npm at the version kernels/package-lock.json pins)
# and Airlock's Bash kernel (internal/stock/bash).
KERNELSPECS := /usr/local/share/jupyter/kernels
DENO := /usr/local/lib/airlock/deno/deno

kernels:
	cd kernels && npm ci --no-audit --no-fund --ignore-scripts >/dev/null
	cmp -s kernels/node_modules/@deno/linux-x64-glibc/deno $(DENO) || install -D -m 0755 kernels/node_modules/@deno/linux-x64-glibc/deno $(DENO)
	install -D -m 0644 kernels/deno/kernel.json $(KERNELSPECS)/deno/kernel.json
	install -D -m 0644 internal/stock/bash/kernel.json $(KERNELSPECS)/bash/kernel.json
	install -D -m 0644 internal/stock/bash/airlock_bash_kernel.py $(KERNELSPECS)/bash/airlock_bash_kernel.py

# Installs only what is missing; needs root and Debian's apt.
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	$(MAKE) --no-print-directory kernels

test: test-go test-sdk test-cluster

# The stock templates' Debian root (internal/stock: debootstrap and apt
# from this host's apt sources, with E2B's base tools and the code
# interpreter's packages), made once per package list and kept outside
# the clone, where a fresh clone finds it; a host's daemons share it
# read-only. airlock serve makes it at its first start otherwise; the
# tests need it made before them, as their servers start in seconds.
STOCK_CACHE ?= /var/cache/airlock/stock
export AIRLOCK_STOCK_CACHE := $(STOCK_CACHE)

stock: build
	$(BIN) template stock --cache $(STOCK_CACHE)

runsc: $(RUNSC)

$(RUNSC):
	GOBIN=$(CURDIR)/bin $(GO) install gvisor.dev/gvisor/runsc@$(RUNSC_VERSION)

test-go: deps build runsc stock
	$(GO) vet ./...
	$(GO) test -count=1 -p 1 ./...
	$(MAKE) test-unprivileged

test-unprivileged: deps
	CGO_ENABLED=1 $(GO) test -race -count=1 -exec $(CURDIR)/tests/as-nobody $(UNPRIVILEGED)

# The official E2B SDKs (pinned in tests/e2b/package-lock.json) against a
# real airlock serve started by the tests, on each backend, inside the
# fake internet: no packet of theirs can leave the machine.
# A small Debian root (debootstrap, from the host's apt mirror) for the
# template tests of aptInstall and pipInstall: made once, kept in .cache.
DEBIAN_ROOT := $(CURDIR)/.cache/debian-root

test-sdk: deps build runsc stock
	tests/fixtures/debian-root.sh $(DEBIAN_ROOT)
	cd tests/e2b && npm ci --no-audit --no-fund && export AIRLOCK_DEBIAN_ROOT=$(DEBIAN_ROOT) && \
		../../$(NETLAB) npm test && AIRLOCK_TEST_BACKEND=gvisor ../../$(NETLAB) npm test

# A real Kubernetes control plane for the cluster tests (no kubelet): etcd
# and kube-apiserver built from the Go module proxy at the versions that
# tests/controlplane/*/go.mod pin, each in a module of its own so that
# Kubernetes stays out of Airlock's go.mod. Built once per version (the API
# server takes ~12 min on 2 cores) and kept outside the clone, where a
# fresh clone finds them.
CONTROLPLANE ?= /var/cache/airlock/controlplane-k8s-v1.37.2-etcd-v3.6.16
export AIRLOCK_CONTROLPLANE := $(CONTROLPLANE)

controlplane: $(CONTROLPLANE)/etcd $(CONTROLPLANE)/kube-apiserver

$(CONTROLPLANE)/etcd:
	mkdir -p $(CONTROLPLANE)
	cd tests/controlplane/etcd && $(GO) build -trimpath -o $@.new go.etcd.io/etcd/server/v3
	mv $@.new $@

$(CONTROLPLANE)/kube-apiserver:
	mkdir -p $(CONTROLPLANE)
	cd tests/controlplane/kube-apiserver && $(GO) build -trimpath -o $@.new k8s.io/kubernetes/cmd/kube-apiserver
	mv $@.new $@

# Three node daemons and a router against that API server, through the
# real E2B SDK (tests/e2b/cluster.k8s.mjs), on the bridge and network
# namespaces the test makes.
test-cluster: deps build controlplane
	cd tests/e2b && npm ci --no-audit --no-fund && node --test --test-timeout=600000 cluster.k8s.mjs

run: deps build
	$(BIN) run -- /usr/bin/python3 -c 'import platform; print("hello from", platform.node())'

serve: deps build
	$(BIN) serve

bench: bench-run bench-serve bench-net bench-template bench-stock bench-pause bench-reliability bench-density bench-cluster bench-tti bench-volumes bench-live bench-egress

bench-run: deps build runsc
	$(BIN) bench -n 50

bench-serve: deps build
	cd tests/e2b && npm ci --no-audit --no-fund && node bench.mjs && node bench-interpreter.mjs && node bench-mcp.mjs

# A sandbox's egress path and networked creates, in the fake internet, on
# each backend.
bench-net: deps build runsc
	cd tests/e2b && npm ci --no-audit --no-fund && ../../$(NETLAB) node bench-net.mjs && AIRLOCK_TEST_BACKEND=gvisor ../../$(NETLAB) node bench-net.mjs

# HTTPS through the proxy that intercepts it for request rules, against
# the proxy that relays TLS and against no proxy at all.
bench-egress: deps build runsc stock
	cd tests/e2b && npm ci --no-audit --no-fund && ../../$(NETLAB) node bench-egress.mjs && AIRLOCK_TEST_BACKEND=gvisor ../../$(NETLAB) node bench-egress.mjs

# Templates: build, create warm and cold, memory of idle sandboxes, on
# each backend, against base in the same run.
bench-template: deps build runsc
	cd tests/e2b && npm ci --no-audit --no-fund && ../../$(NETLAB) node bench-template.mjs && AIRLOCK_TEST_BACKEND=gvisor ../../$(NETLAB) node bench-template.mjs

# The stock templates on the Debian root against the jail: pool claims,
# memory per idle sandbox, the code interpreter's first cells.
bench-stock: deps build stock
	cd tests/e2b && npm ci --no-audit --no-fund && node bench-stock.mjs

# Reliability in full: a burst of 100 creates, 500 create/exec/kill cycles
# and what each resource held before and after, recovery from kill -9,
# noisy neighbours; in the fake internet, on each backend.
bench-reliability: deps build runsc
	cd tests/e2b && npm ci --no-audit --no-fund && ../../$(NETLAB) node bench-reliability.mjs && AIRLOCK_TEST_BACKEND=gvisor ../../$(NETLAB) node bench-reliability.mjs

# Density and bursts as an operator plans capacity: memory per idle
# sandbox, how many idle sandboxes the host holds, pool refill rate, a
# burst of 100 creates; on each backend.
bench-density: deps build runsc
	cd tests/e2b && npm ci --no-audit --no-fund && AIRLOCK_DENSITY_PID_MAX=4194304 ../../$(NETLAB) node bench-density.mjs && AIRLOCK_DENSITY_PID_MAX=4194304 AIRLOCK_TEST_BACKEND=gvisor ../../$(NETLAB) node bench-density.mjs

# Three nodes and a router against a real API server: create latency
# through the router against straight to a node, and creates per second
# across the nodes.
bench-cluster: deps build controlplane
	cd tests/e2b && npm ci --no-audit --no-fund && node bench-cluster.mjs

# Pause and resume on gVisor: saved to disk against frozen in memory.
# Time to interactive as the ComputeSDK scoreboard measures it: create,
# then node -v; sequential and 100 at once, on each backend.
bench-tti: deps build runsc stock
	cd tests/e2b && npm ci --no-audit --no-fund && ../../$(NETLAB) node bench-tti.mjs && AIRLOCK_TEST_BACKEND=gvisor ../../$(NETLAB) node bench-tti.mjs

bench-volumes: deps build runsc stock
	cd tests/e2b && npm ci --no-audit --no-fund && ../../$(NETLAB) node bench-volumes.mjs && AIRLOCK_TEST_BACKEND=gvisor ../../$(NETLAB) node bench-volumes.mjs

bench-live: deps build runsc stock
	cd tests/e2b && npm ci --no-audit --no-fund && ../../$(NETLAB) node bench-live.mjs && AIRLOCK_TEST_BACKEND=gvisor ../../$(NETLAB) node bench-live.mjs

bench-pause: deps build runsc
	cd tests/e2b && npm ci --no-audit --no-fund && node bench-pause.mjs

# Every fuzzer of the repository, FUZZTIME each (their seed corpora run
# in make test as ordinary tests).
FUZZTIME ?= 30s
fuzz:
	@grep -rl --include='*_test.go' '^func Fuzz' internal cmd | sort | while read -r f; do \
		for fn in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$fn ./$$(dirname $$f)"; \
			$(GO) test -run='^$$' -fuzz="^$$fn$$" -fuzztime=$(FUZZTIME) ./$$(dirname $$f) || exit 1; \
		done; \
	done

clean:
	rm -rf bin $(SANDBOX_BIN) $(SANDBOX_BIN).sha256 $(CONSOLE_DIST)/assets $(CONSOLE_DIST)/index.html
