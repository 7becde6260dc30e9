# Baton. `make dev` runs it; `make test` tests it. Both install what a fresh
# Debian machine lacks first (PostgreSQL server binaries).

GO        ?= go
BIN       := bin/baton
PKGS      := ./...
# The race detector needs cgo.
export CGO_ENABLED := 1

.PHONY: all build test test-deps lint fmt vet dev deps bench chaos chaos-agents clean docs image image-check fuzz

all: build

build:
	$(GO) build -trimpath -o $(BIN) ./cmd/baton

# Install what the machine lacks, from Debian's packages: the PostgreSQL
# server binaries (for `baton dev` and the tests), Chromium (for the web
# page tests), promtool (for the tests of the alert rules and the
# dashboard), psycopg (for the Python producer example) and Node.js with
# npm (for the real clients, servers and example apps some tests run,
# whose packages test-deps installs).
deps:
	@./scripts/install-deps.sh postgres

# Folders whose npm packages the tests use (real clients and servers, the
# example apps), installed from the lockfile beside each, again only when
# the lockfile changed.
NPM_DIRS := internal/oidctest/provider agent/testdata/mcp-everything agent/testdata/a2a examples/producer-node examples/group-node examples/chat-usechat examples/agent-ai-sdk examples/agent-ag-ui internal/e2e/aisdk
test-deps:
	@./scripts/install-deps.sh postgres chromium prometheus chaos node psycopg tour
	@for d in $(NPM_DIRS); do \
		[ $$d/node_modules/.package-lock.json -nt $$d/package-lock.json ] || \
		(cd $$d && npm ci --no-audit --no-fund --loglevel=error) || exit 1; \
	done

# The binaries the tests run as real processes are built once for the
# run, before it, into bin/test, and named to the tests in variables
# (internal/testenv): cmd/baton with the race detector, without it (for
# the tests that run dozens of processes: chaos, the deployments, the
# tour) and with the chaosbroken tag (the worker the kill test must fail).
# Built in the same run as the tests, they are the sources under test.
# Four parallel tests per package instead of one per CPU: most of them
# wait (for leases, retries, processes, a model's Retry-After) far more
# than they compute: agent's and consumer's tests, for two, took a fifth
# to a half less time on two cores with four at a time. Three packages at
# a time instead of one per CPU, for the same reason: on two cores the
# whole run took 6m21s with three against 8m14s with two, its processor
# time the same.
TEST_BIN := $(abspath bin/test)
test: test-deps
	$(GO) build -race -o $(TEST_BIN)/baton-race ./cmd/baton
	$(GO) build -o $(TEST_BIN)/baton ./cmd/baton
	$(GO) build -tags chaosbroken -o $(TEST_BIN)/baton-chaosbroken ./cmd/baton
	BATON_TEST_RACE_BINARY=$(TEST_BIN)/baton-race \
	BATON_TEST_PLAIN_BINARY=$(TEST_BIN)/baton \
	BATON_TEST_CHAOSBROKEN_BINARY=$(TEST_BIN)/baton-chaosbroken \
		$(GO) test -race -count=1 -p 3 -parallel 4 -timeout 20m $(PKGS)

# Every fuzz target (each Fuzz function of a package's tests), fuzzed in
# turn for FUZZTIME each, one package at a time: the decoders of the relay
# and the events, the ids, and the API's front door, whose targets send
# any body and any path id to every route and require that nothing is a
# 500, that a refusal writes nothing, and that the server goes on serving.
# `make test` runs only their seeds (each defect found before is one). A
# failure leaves its input in the package's testdata/fuzz, where `make
# test` runs it from then on. FUZZTIME=5m fuzzes longer.
FUZZTIME ?= 30s
FUZZ_PKGS = $(shell grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u)
fuzz: test-deps
	@for pkg in $(FUZZ_PKGS); do \
		for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "fuzz $$pkg $$target for $(FUZZTIME)"; \
			$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

# The checks CI runs before the tests, each its own step. Staticcheck is
# pinned by the tool line in go.mod. It checks the default build and the
# chaosbroken one in one run and merges them, so that code only the
# chaosbroken build uses is not reported as unused. go mod tidy -diff
# fails on a go.mod or go.sum that tidy would change, and leaves them as
# they are.
lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')) || exit 1; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	printf 'default:\nchaosbroken: -tags chaosbroken\n' | $(GO) tool staticcheck -matrix $(PKGS)
	$(GO) mod tidy -diff

# Both builds: the chaosbroken tag compiles code the default build leaves out.
vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags chaosbroken $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

# The generated parts of the reference pages: every command and setting
# from the binary's flags (docs/reference/cli.md), every metric from the
# code's declarations (docs/reference/metrics.md). A test fails when the
# checked-in pages differ from what the code says.
docs:
	$(GO) run ./internal/docgen/cmd/docgen

# Baton's OCI image, built with Go alone (no container engine): the static
# binary on an empty base, as a user without privileges, no shell, the
# version in its labels. Writes bin/baton-image.tar (load it with
# `docker load`, `podman load` or push it with crane).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE   ?= baton:$(VERSION)
image:
	$(GO) run ./deploy/image/make-image --version $(VERSION) --tag $(IMAGE) --out bin/baton-image.tar

# The image a release ships, checked: `make image`, then the test that
# reads its tarball (what it holds, its user, its static binary running
# as that user and printing its version). `make test` checks the image's
# layout on a small stand-in binary instead: a static build of all of
# Baton takes minutes on a cold build cache. CI runs both.
image-check: image
	BATON_IMAGE_TARBALL=$(abspath bin/baton-image.tar) BATON_IMAGE_VERSION=$(VERSION) \
		$(GO) test -race -count=1 -run 'TestTheReleaseImage' ./deploy/image/

dev: deps build
	./$(BIN) dev

# The benchmarks: real baton processes (this tree's binary, and for the
# turn rate the binary of the commit before the one-statement claim, built
# from a git worktree), a durable PostgreSQL and NATS. Each figure is
# measured against its reference in the same run (BenchmarkFloor's is the
# floor chain, the same hops without Baton's logic); the table at the end
# shows value, reference, ratio, aim, and the change since the report kept
# in docs/internals/measured.jsonl. The run writes its tables into
# docs/internals/measured.md (between its markers) and its figures into
# measured.jsonl, for the next run to compare with: commit both. One
# package at a time, so that nothing else runs beside a measurement.
# BENCH_ARGS="-bench Turns" picks benchmarks (the others keep their
# figures of the earlier run); BATON_BENCH_PERF=<dir> records perf
# profiles of the processes that limit a figure.
# The console's pages are timed in process over 1,000,000 conversations
# and 10,000,000 messages seeded inside PostgreSQL (some minutes;
# BATON_CONSOLE_BENCH_CONVERSATIONS=N a smaller size).
BENCH_REPORT ?= bin/bench-report.jsonl
BENCH_KEPT   := docs/internals/measured.jsonl
BENCH_DOC    := docs/internals/measured.md
BENCH_PKGS   := ./consumer/ ./api/ ./agent/ ./relay/ ./schema/ ./console/ ./internal/bench/floor/ ./internal/e2e/
# The names are anchored: ./agent/ also holds BenchmarkTurnsOfAGrowingConversation,
# an in-process benchmark that `make bench` leaves out, and ./consumer/
# BenchmarkKillToNextTurn, which waits out a 30 s lease at each of its
# kills (15 minutes).
BENCH_ARGS   ?= -bench '^(BenchmarkDebounce|BenchmarkTurns|BenchmarkEventStreams|BenchmarkChat|BenchmarkRelayDrain|BenchmarkRelayLatency|BenchmarkProducer|BenchmarkAgentStep|BenchmarkAttachments|BenchmarkConsole|BenchmarkMCPCallOverhead|BenchmarkFloor|BenchmarkStopUnderLoad)$$'
bench: deps build
	@mkdir -p $(dir $(BENCH_REPORT)) && rm -f $(BENCH_REPORT)
	@status=0; \
	BATON_TEST_BINARY=$(abspath $(BIN)) BATON_BENCH_REPORT=$(abspath $(BENCH_REPORT)) \
		$(GO) test -p 1 -count=1 -run '^$$' $(BENCH_ARGS) -benchtime 1x -timeout 60m $(BENCH_PKGS) || status=$$?; \
	echo; $(GO) run ./internal/bench/cmd/benchtable -previous $(BENCH_KEPT) -save -doc $(BENCH_DOC) $(BENCH_REPORT) || status=1; \
	exit $$status

# The kill test at full size: real processes, random faults from a printed
# seed, a verdict from the database. Pass CHAOS_ARGS="--seed N" to replay a
# run. The binary is built without -race: a dozen processes share the CPUs.
CHAOS_ARGS ?=
chaos: deps build
	@./scripts/install-deps.sh chaos
	$(GO) run ./chaos/cmd/chaos --binary $(BIN) $(CHAOS_ARGS)

# The kill test with external agents, at the size of `make chaos`: the
# workers post their steps to example agents built on frameworks, each
# run with node behind a recorder of the test (two workers on the Mastra
# agent over AG-UI, one on the AI SDK route; CHAOS_AGENTS names others),
# and the agents' faults join the schedule: an agent killed, an agent
# down past the workers' retries, a worker killed while its step is in
# flight, a worker cut from its agent, an agent's link down or slowed.
# Mastra is heavy: its packages are installed here, not by make test.
CHAOS_AGENTS ?= mastra,mastra,ai-sdk
chaos-agents: deps build
	@./scripts/install-deps.sh chaos agents
	$(GO) run ./chaos/cmd/chaos --binary $(BIN) --agents $(CHAOS_AGENTS) $(CHAOS_ARGS)

clean:
	rm -rf bin .baton
