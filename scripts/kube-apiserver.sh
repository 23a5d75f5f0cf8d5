#!/usr/bin/env bash
# Finds or builds a kube-apiserver for deploy/apiserver's test and prints
# the binary's path on stdout.
#
#   KUBE_APISERVER=$(scripts/kube-apiserver.sh)
#
# In order:
#   1. $KUBE_APISERVER, when set: it must be an executable file; the script
#      prints it and builds nothing.
#   2. A binary built before on this machine, in a cache outside the clone
#      (every clone and CI run on the machine shares it), keyed by version:
#      $GPUMEM_CACHE/kube-apiserver/<version>/kube-apiserver, where
#      GPUMEM_CACHE defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/gpumem_exporter.
#   3. Otherwise it builds one there from the Go module proxy: about 22
#      CPU-minutes the first time, under a minute with Go's build cache warm.
#      It prints a progress line every 30 seconds (packages compiled so far
#      of those to compile; KUBE_APISERVER_PROGRESS_SECONDS sets another
#      interval); two runs at once build it once (flock).
#
# k8s.io/kubernetes replaces its staging modules (k8s.io/api, k8s.io/apiserver,
# ...) with folders of its own repository, which the module proxy does not
# serve. The build therefore runs in a temporary module outside this
# repository whose go.mod requires k8s.io/kubernetes@<version> and replaces
# every staging module with its published version: v1.X.Y's staging modules
# are published as v0.X.Y.
#
# KUBE_APISERVER_VERSION picks another version (default below; it matches the
# k8s.io/* v0.37.2 modules in go.mod). Everything but the path goes to stderr.
set -euo pipefail
me=scripts/kube-apiserver.sh

if [ -n "${KUBE_APISERVER:-}" ]; then
  if [ -f "$KUBE_APISERVER" ] && [ -x "$KUBE_APISERVER" ]; then
    echo "$me: using \$KUBE_APISERVER=$KUBE_APISERVER" >&2
    echo "$KUBE_APISERVER"
    exit 0
  fi
  echo "$me: \$KUBE_APISERVER=$KUBE_APISERVER is not an executable file; unset it to build one" >&2
  exit 2
fi

version=${KUBE_APISERVER_VERSION:-v1.37.2}
case $version in
v1.*.*) ;;
*) echo "$me: KUBE_APISERVER_VERSION must look like v1.37.2, not $version" >&2; exit 2 ;;
esac
staging=v0.${version#v1.}

cache=${GPUMEM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpumem_exporter}
dir=$cache/kube-apiserver/$version
bin=$dir/kube-apiserver
if [ -x "$bin" ]; then
  echo "$me: using $bin, built before" >&2
  echo "$bin"
  exit 0
fi

mkdir -p "$dir"
exec 3>&1 1>&2 # the go commands' chatter stays off stdout
# One build at a time per version on the machine: a concurrent invocation
# waits for the build under way, then finds its binary.
exec 4>"$dir/.lock"
if ! flock -n 4; then
  echo "$me: another run is building kube-apiserver $version into $dir; waiting for it"
  flock 4
fi
if [ -x "$bin" ]; then
  echo "$bin" >&3
  exit 0
fi

start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/kube-apiserver-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

go mod init gpumem.invalid/kube-apiserver-build
go mod edit -require="k8s.io/kubernetes@$version"
modfile=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
if [ ! -f "$modfile" ]; then
  echo "$me: could not download k8s.io/kubernetes@$version's go.mod" >&2
  exit 1
fi
# Every "k8s.io/x => ./staging/src/k8s.io/x" line of k8s.io/kubernetes's go.mod.
mods=$(sed -n 's#^[[:space:]]*\(k8s.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$modfile")
if [ -z "$mods" ]; then
  echo "$me: no staging replace lines in $modfile" >&2
  exit 1
fi
for m in $mods; do
  go mod edit -replace="$m=$m@$staging"
done
cat >tools.go <<'GO'
// Package build only makes go mod tidy resolve kube-apiserver's dependencies.
package build

import _ "k8s.io/kubernetes/cmd/kube-apiserver/app"
GO
echo "$me: resolving k8s.io/kubernetes@$version with staging modules at $staging"
go mod tidy

main=k8s.io/kubernetes/cmd/kube-apiserver
total=$(go list -deps "$main" | wc -l)
echo "$me: building kube-apiserver $version into $dir: $total packages, about 22 CPU-minutes the first time on a machine (under a minute with Go's build cache warm)"
pkg=k8s.io/component-base/version
minor=${version#v1.}
minor=${minor%%.*}
# go build -v names each package as it compiles it (not those Go's build
# cache already holds); the loop turns that into a line every $every
# seconds (a shell loop: mawk reads a pipe in blocks, so its count would
# lag).
every=${KUBE_APISERVER_PROGRESS_SECONDS:-30}
set +e
nice -n 19 go build -v -trimpath -o "$dir/kube-apiserver.tmp" \
  -ldflags "-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
  "$main" 2>&1 |
  {
    n=0 last=$start
    while IFS= read -r line; do
      case $line in
      "" | *" "* | *:*) echo "$line" ;; # not a package path: an error or a note
      *)
        n=$((n + 1))
        printf -v now '%(%s)T' -1
        if [ $((now - last)) -ge "$every" ]; then
          last=$now
          echo "$me: compiled $n of at most $total packages, $(((now - start) / 60)) min $(((now - start) % 60)) s so far"
        fi
        ;;
      esac
    done
  }
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "$me: go build of kube-apiserver $version failed (exit $status); see above" >&2
  exit 1
fi
mv "$dir/kube-apiserver.tmp" "$bin"
took=$(($(date +%s) - start))
echo "$me: built $bin in $((took / 60)) min $((took % 60)) s"
echo "$bin" >&3
