# Baton. `make dev` runs it; `make test` tests it. Both install what a fresh
# Debian machine lacks first (PostgreSQL server binaries).

GO        ?= go
BIN       := bin/baton
PKGS      := ./...
# The race detector needs cgo.
export CGO_ENABLED := 1

.PHONY: all build test test-deps lint fmt vet dev deps bench chaos clean

all: build

build:
	$(GO) build -trimpath -o $(BIN) ./cmd/baton

# Install what the machine lacks, from Debian's packages: the PostgreSQL
# server binaries (for `baton dev` and the tests), Chromium (for the web
# page tests) and promtool (for the tests of the alert rules and the
# dashboard). Nothing else is fetched.
deps:
	@./scripts/install-deps.sh postgres

test-deps:
	@./scripts/install-deps.sh postgres chromium prometheus

test: test-deps
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

dev: deps build
	./$(BIN) dev

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./relay/ ./consumer/

# The kill test at full size: real processes, random faults from a printed
# seed, a verdict from the database. Pass CHAOS_ARGS="--seed N" to replay a
# run. The binary is built without -race: a dozen processes share the CPUs.
CHAOS_ARGS ?=
chaos: deps build
	$(GO) run ./chaos/cmd/chaos --binary $(BIN) $(CHAOS_ARGS)

clean:
	rm -rf bin .baton
