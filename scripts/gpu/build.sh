#!/usr/bin/env bash
# Builds what the scripts in scripts/gpu run, on a machine with Go (the
# GPU machine needs none), into $BIN (default .bin, ignored by git),
# gzipped so that the folder travels small:
#   gpumem_exporter        the exporter, as a release builds it
#   gpumem_exporter_pprof  the same with -tags pprof and symbols (profile.sh)
#   nvmlpoll.test          the poll benchmarks (BenchmarkReal*)
#   allocstats.test        the ingest benchmark (BenchmarkIngestEndToEnd)
#   nvidia_gpu_exporter    the peer (compare_peers.sh), where PEER_SRC is a
#                          checkout of github.com/utkuozdemir/nvidia_gpu_exporter
# From the repository root:
#   bash scripts/gpu/build.sh
#   PEER_SRC=/tmp/nvidia_gpu_exporter bash scripts/gpu/build.sh
# It builds the working tree. To measure another commit, run it in a copy
# of that commit (git archive COMMIT | tar -x -C DIR) with BIN=$PWD/.bin/old.
set -euo pipefail
BIN=${BIN:-.bin}
mkdir -p "$BIN"
BIN=$(cd "$BIN" && pwd)
export CGO_ENABLED=1 CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

go build -trimpath -ldflags '-s -w' -o "$work/gpumem_exporter" .
go build -trimpath -tags pprof -o "$work/gpumem_exporter_pprof" .
go test -c -trimpath -ldflags '-s -w' -o "$work/nvmlpoll.test" ./nvmlpoll
go test -c -trimpath -ldflags '-s -w' -o "$work/allocstats.test" ./allocstats
if [ -n "${PEER_SRC:-}" ]; then
	(cd "$PEER_SRC" && go build -trimpath \
		-ldflags '-s -w -X github.com/utkuozdemir/nvidia_gpu_exporter/internal/app.DefaultBackend=nvml' \
		-o "$work/nvidia_gpu_exporter" ./cmd/nvidia_gpu_exporter)
fi
for f in "$work"/*; do
	gzip -9 -c "$f" >"$BIN/$(basename "$f").gz"
	rm -f "$BIN/$(basename "$f")" # an older unzipped copy would win over the new one
done
ls -l "$BIN"
