# gpumem_exporter: build, test, lint, bench. cgo is required (go-nvml).
GO          ?= go
export CGO_ENABLED := 1
# go-nvml's header marks some calls deprecated; we do not call them.
export CGO_CFLAGS  ?= -O2 -g -Wno-deprecated-declarations
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
FUZZ_TARGETS := FuzzDecodeLine:./allocstats/ FuzzScanWire:./allocstats/ FuzzParseCgroup:./workload/

.PHONY: all build test test-go test-leadtime test-python fuzz fuzz-long lint bench clean

all: build

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o gpumem_exporter .

# Test binaries go test runs at once: at least 3, one more than the 2-core
# development machine has, because the end-to-end test spends most of its
# 20 s waiting on Prometheus (-p 3: 73 s there, the default 2: 82 s).
TESTP       ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -lt 3 ] && echo 3 || echo $$n)

# The whole test suite: Go (race detector, end-to-end against the built
# binary), then, at once (-O keeps each one's output together), the
# alerts' lead-time test, a short fuzz run of the wire decoder and the
# cgroup parser, and the Python client (which mostly waits).
test: test-go
	@$(MAKE) --no-print-directory -j3 -O test-leadtime fuzz test-python

test-go:
	$(GO) test -race -count=1 -p $(TESTP) ./...

# The lead-time test measures the alert rules over simulated days with
# promtool; it skips itself under -race (nothing shared to race on, twice
# as slow) and runs here without.
test-leadtime:
	$(GO) test -count=1 -run '^TestAlertLeadTime$$' ./deploy/prometheus/

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  $(GO) test -run='^$$' -fuzz="^$${t%%:*}$$" -fuzztime=$(FUZZCOUNT) "$${t#*:}"; done

fuzz-long:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  $(GO) test -run='^$$' -fuzz="^$${t%%:*}$$" -fuzztime=$(FUZZTIME) "$${t#*:}"; done

test-python:
	python3 -m unittest discover -s clients/python

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...

bench:
	$(GO) test -run='^$$' -bench=. -benchmem ./...

clean:
	rm -f gpumem_exporter
