# gpumem_exporter: build, test, lint, bench. cgo is required (go-nvml).
GO          ?= go
export CGO_ENABLED := 1
# go-nvml's header marks some calls deprecated; we do not call them.
export CGO_CFLAGS  ?= -O2 -g -Wno-deprecated-declarations
# Two modules: the product's (this directory: what gpumem_exporter and
# gpumem-csi import) and deploy/'s (the deployment's tests, with the Helm
# SDK, kustomize, csi-test; it replaces the product module with ../). Each
# is built and tested with its own go.mod: a go.work of a developer's would
# let deploy/'s requirements raise the product's.
export GOWORK      := off
DEPLOY      := deploy
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS     := -X github.com/prometheus/common/version.Version=$(VERSION) \
               -X github.com/prometheus/common/version.Revision=$(REVISION) \
               -X github.com/prometheus/common/version.Branch=main
# Fuzzing in make test is bounded by a count of inputs, not by time: with a
# time limit, Go 1.26's fuzzer can fail with "context deadline exceeded"
# and no failing input. `make fuzz-long` fuzzes for a while instead.
FUZZCOUNT   ?= 3000x
FUZZTIME    ?= 2m
FUZZ_TARGETS := FuzzDecodeLine:./allocstats/wire/ FuzzScanWire:./allocstats/wire/ FuzzParseCgroup:./workload/

.PHONY: all build test test-go test-leadtime test-python fuzz fuzz-long lint bench clean

all: build

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o gpumem_exporter .

# Test binaries go test runs at once (but for the timed suites below): at
# least 3, one more than a 2-core machine has, because the rules' tests
# spend much of their time waiting on promtool.
TESTP       ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -lt 3 ] && echo 3 || echo $$n)

# The whole test suite: Go (race detector, end-to-end against the built
# binary, the alerts' lead-time test), then, at once (-O keeps each one's
# output together), a short fuzz run of the wire decoder and the cgroup
# parser, and the Python client (which mostly waits); at the end, every
# test that skipped, with its reason (scripts/gotest.sh and
# scripts/python_tests.py collect them in $(SKIPPED)).
SKIPPED     := $(CURDIR)/.cache/skipped-tests
test:
	@mkdir -p $(dir $(SKIPPED)) && : >$(SKIPPED)
	@$(MAKE) --no-print-directory GOTEST_SKIPS=$(SKIPPED) test-go
	@$(MAKE) --no-print-directory -j2 -O GOTEST_SKIPS=$(SKIPPED) fuzz test-python
	@if [ -s $(SKIPPED) ]; then \
	  echo "Skipped tests ($$(wc -l <$(SKIPPED))), with their reasons:"; \
	  sort $(SKIPPED) | awk -F '\t' '{ print "  " $$1 " " $$2 ": " $$3 }'; \
	else echo "No test skipped."; fi

# As go test -race -count=1 ./... in both modules (deploy/'s with -C; one
# pool of test binaries runs the two), through scripts/gotest.sh: it keeps
# the linked test binaries in Go's build cache, which go test relinks at
# every run. go test's own vet pass is off: make lint runs go vet on everything,
# and the pass would vet every dependency once more for its facts.
# The end-to-end and attack suites time what an exporter answers under
# load: they run after the others, one package at a time, so that the
# other test binaries do not share the two cores with them.
TIMED_PKGS  := ./attack/ ./e2e/
test-go:
	GOTEST_P=$(TESTP) scripts/gotest.sh -race -vet=off -- $$($(GO) list ./... | grep -v -e '/attack$$' -e '/e2e$$') -C $(DEPLOY) ./...
	GOTEST_P=1 scripts/gotest.sh -race -vet=off -- $(TIMED_PKGS)

# Only the alerts' lead-time test (measures the rules over simulated days
# with promtool; part of test-go).
test-leadtime:
	$(GO) -C $(DEPLOY) test -race -count=1 -run '^TestAlertLeadTime$$' -v ./prometheus/

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  $(GO) test -run='^$$' -fuzz="^$${t%%:*}$$" -fuzztime=$(FUZZCOUNT) "$${t#*:}"; done

fuzz-long:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  $(GO) test -run='^$$' -fuzz="^$${t%%:*}$$" -fuzztime=$(FUZZTIME) "$${t#*:}"; done

test-python:
	python3 scripts/python_tests.py clients/python

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) -C $(DEPLOY) vet ./...

# The product module's benchmarks (deploy/ has none).
bench:
	$(GO) test -run='^$$' -bench=. -benchmem ./...

clean:
	rm -f gpumem_exporter
