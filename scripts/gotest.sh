#!/usr/bin/env bash
# gotest.sh [go test build flags] -- [packages] [-C DIR [packages]]...:
# what `go test -count=1 FLAGS PACKAGES` does, from test binaries that Go's
# build cache keeps. `-C DIR` runs the packages after it in the module at
# DIR, as `go -C DIR test` would (the repository has two modules: the
# product's and deploy/'s); packages default to ./... .
#
# `go test` links every test binary again at each run (about 45 CPU-seconds
# of a warm `make test` on the race build here); `go test -c` takes the
# linked binary from the build cache when nothing changed. This script
# builds the binaries with -c into $GOTEST_BIN (default .cache/testbin),
# then runs each in its package's directory, as go test does, at most
# $GOTEST_P at once (default: the CPUs), the slowest of the last run first.
# A package's output is printed when it fails (the failing tests' lines,
# as go test prints them), or in full with GOTEST_V=1; the exit status is
# 1 when any failed. Every skipped test is listed at the end with its
# reason (the last thing it logged), or, with GOTEST_SKIPS=FILE, added to
# FILE ("package<TAB>test<TAB>reason" lines) for the caller to list (make
# test does, after the Python tests').
set -euo pipefail

flags=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
[ $# -gt 0 ] && shift
# The groups of packages, one per module: dirs[i] is the module's
# directory, pkgs[i] its packages (space-separated). The packages before
# any -C are the current directory's; none there and a -C later: none.
dirs=(.) pkgs=("")
while [ $# -gt 0 ]; do
  if [ "$1" = -C ]; then
    [ $# -ge 2 ] || { echo "gotest.sh: -C needs a directory" >&2; exit 2; }
    dirs+=("$2") pkgs+=("")
    shift 2
  else
    pkgs[${#pkgs[@]}-1]+="$1 "
    shift
  fi
done
if [ -z "${pkgs[0]}" ] && [ ${#dirs[@]} -gt 1 ]; then
  dirs=("${dirs[@]:1}") pkgs=("${pkgs[@]:1}")
fi
bin=${GOTEST_BIN:-.cache/testbin}
jobs=${GOTEST_P:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$bin"
bin=$(cd "$bin" && pwd)

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# -c names each binary after the last element of its import path (the
# build fails if two packages of a module share one); each module's
# binaries go to a folder of their own: $bin for the current directory's,
# $bin/C_<dir> for the others.
modbin() { if [ "$1" = . ]; then echo "$bin"; else echo "$bin/C_${1//\//_}"; fi; }
built=0
for i in "${!dirs[@]}"; do
  read -ra p <<<"${pkgs[$i]:-./...}"
  mkdir -p "$(modbin "${dirs[$i]}")"
  go -C "${dirs[$i]}" test "${flags[@]}" -c -o "$(modbin "${dirs[$i]}")/" "${p[@]}" >>"$logs/build" 2>&1 || built=$?
done
grep -v '\[no test files\]$' "$logs/build" || true
[ "$built" -eq 0 ] || exit 2
# The binaries run with -test.v, which streams each test's lines under a
# "=== RUN/CONT/NAME test" header and ends it with "--- PASS/FAIL/SKIP:
# test". failed_lines keeps what go test without -v prints: the lines of
# tests that failed or never finished, and those outside any test.
failed_lines='
NR == FNR { if ($1 == "---") done[$3] = $2; next }
/^=== (RUN|PAUSE|CONT|NAME) / { cur = $3; next }
$1 == "---" { cur = $3; if ($2 == "FAIL:") print; next }
/^PASS$/ { next }
cur == "" || !(cur in done) || done[cur] == "FAIL:" { print }'
# skipped_tests prints "package<TAB>test<TAB>reason" for each skipped test:
# its reason is the first line of the last message it logged.
skipped_tests='
/^=== (RUN|PAUSE|CONT|NAME) / { cur = $3; next }
$1 == "---" {
  if ($2 == "SKIP:") { r = last[$3]; sub(/^ +/, "", r); if (r == "") r = "(no reason given)"; print pkg "\t" $3 "\t" r }
  cur = $3; next
}
/^ +[^ ]+\.go:[0-9]+: / && cur != "" { last[cur] = $0 }'
export bin logs failed_lines skipped_tests GOTEST_V="${GOTEST_V:-}"
# Slowest first (by the last run's times; a package not timed yet first of
# all), so that the longest package does not start last.
touch "$bin/durations"
# Each line: package, its directory, the folder of its test binary.
{
  listed=0
  for i in "${!dirs[@]}"; do
    read -ra p <<<"${pkgs[$i]:-./...}"
    go -C "${dirs[$i]}" list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{"\t"}}{{.Dir}}{{end}}' "${p[@]}" |
      awk -v b="$(modbin "${dirs[$i]}")" 'NF { print $0 "\t" b }' || listed=1
  done
  exit "$listed"
} |
  awk -F '\t' -v timed="$bin/durations" 'BEGIN { while ((getline l < timed) > 0) { split(l, f, "\t"); took[f[1]] = f[2] } }
    { print (($1 in took) ? took[$1] : 1e9) "\t" $0 }' |
  sort -t "$(printf '\t')" -k1,1gr | cut -f 2- |
  xargs -r -P "$jobs" -d '\n' -n 1 bash -c '
    IFS=$'"'"'\t'"'"' read -r pkg dir pkgbin <<<"$0"
    name=${pkg##*/}
    log="$logs/${pkg//\//_}"
    start=$(date +%s.%N)
    status=ok
    (cd "$dir" && exec "$pkgbin/$name.test" -test.v=true -test.count=1 -test.timeout=10m0s -test.paniconexit0) >"$log" 2>&1 || status=FAIL
    took=$(awk -v a="$start" -v b="$(date +%s.%N)" "BEGIN { printf \"%.3fs\", b - a }")
    {
      flock 9 # one package'"'"'s lines together
      if [ -n "$GOTEST_V" ]; then
        cat "$log"
      elif [ "$status" = FAIL ]; then
        awk "$failed_lines" "$log" "$log"
      fi
      printf "%s\t%s\t%s\n" "$status" "$pkg" "$took"
      printf "%s\t%s\n" "$pkg" "${took%s}" >>"$logs/durations"
      awk -v pkg="$pkg" "$skipped_tests" "$log" >>"$logs/skipped"
    } 9>"$logs/.lock"
    [ "$status" = ok ]
  ' || failed=1
# Keep the times of packages this run did not run.
touch "$logs/durations"
awk -F '\t' -v ran="$logs/durations" 'BEGIN { while ((getline l < ran) > 0) { split(l, f, "\t"); seen[f[1]] = 1; print l } }
  !($1 in seen)' "$bin/durations" >"$logs/all" &&
  mv "$logs/all" "$bin/durations"
touch "$logs/skipped"
if [ -n "${GOTEST_SKIPS:-}" ]; then
  cat "$logs/skipped" >>"$GOTEST_SKIPS"
elif [ -s "$logs/skipped" ]; then
  echo "Skipped tests ($(wc -l <"$logs/skipped")), with their reasons:"
  sort "$logs/skipped" | awk -F '\t' '{ print "  " $1 " " $2 ": " $3 }'
fi
if [ -n "${failed:-}" ]; then
  echo "FAIL: see the packages above"
  exit 1
fi
