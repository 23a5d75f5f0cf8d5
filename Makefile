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
FUZZTIME    ?= 10s

.PHONY: all build test test-go test-python fuzz lint bench clean

all: build

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o gpumem_exporter .

# The whole test suite: Go (race detector, end-to-end against the built
# binary), a short fuzz run of the wire decoder, and the Python client.
test: test-go fuzz test-python

test-go:
	$(GO) test -race -count=1 ./...

fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzDecodeLine -fuzztime=$(FUZZTIME) ./allocstats/
	$(GO) test -run='^$$' -fuzz=FuzzParseCgroup -fuzztime=$(FUZZTIME) ./workload/

test-python:
	python3 -m unittest discover -s clients/python

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...

bench:
	$(GO) test -run='^$$' -bench=. -benchmem ./...

clean:
	rm -f gpumem_exporter
