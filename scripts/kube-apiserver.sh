#!/usr/bin/env bash
# Builds kube-apiserver from the Go module proxy for deploy/apiserver's
# test, once per version, and prints the binary's path on stdout.
#
#   KUBE_APISERVER=$(scripts/kube-apiserver.sh)
#
# The binary lands in .cache/kube-apiserver/<version>/kube-apiserver (ignored
# by git); when it is already there the script prints its path and does
# nothing else. The first build takes about 22 CPU-minutes; with Go's build
# cache warm (another clone, e.g. CI's) it takes under a minute.
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

version=${KUBE_APISERVER_VERSION:-v1.37.2}
case $version in
v1.*.*) ;;
*) echo "scripts/kube-apiserver.sh: KUBE_APISERVER_VERSION must look like v1.37.2, not $version" >&2; exit 2 ;;
esac
staging=v0.${version#v1.}

root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/.cache/kube-apiserver/$version
bin=$dir/kube-apiserver
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

exec 3>&1 1>&2 # the go commands' chatter stays off stdout
start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/kube-apiserver-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0

go mod init gpumem.invalid/kube-apiserver-build
go mod edit -require="k8s.io/kubernetes@$version"
modfile=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
if [ ! -f "$modfile" ]; then
  echo "scripts/kube-apiserver.sh: could not download k8s.io/kubernetes@$version's go.mod" >&2
  exit 1
fi
# Every "k8s.io/x => ./staging/src/k8s.io/x" line of k8s.io/kubernetes's go.mod.
mods=$(sed -n 's#^[[:space:]]*\(k8s.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$modfile")
if [ -z "$mods" ]; then
  echo "scripts/kube-apiserver.sh: no staging replace lines in $modfile" >&2
  exit 1
fi
for m in $mods; do
  go mod edit -replace="$m=$m@$staging"
done
cat >tools.go <<'EOF'
// Package build only makes go mod tidy resolve kube-apiserver's dependencies.
package build

import _ "k8s.io/kubernetes/cmd/kube-apiserver/app"
EOF
echo "scripts/kube-apiserver.sh: resolving k8s.io/kubernetes@$version with staging modules at $staging"
go mod tidy

echo "scripts/kube-apiserver.sh: building kube-apiserver $version (about 22 CPU-minutes the first time)"
mkdir -p "$dir"
pkg=k8s.io/component-base/version
minor=${version#v1.}
minor=${minor%%.*}
nice -n 19 go build -trimpath -o "$dir/kube-apiserver.tmp" \
  -ldflags "-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
  k8s.io/kubernetes/cmd/kube-apiserver
mv "$dir/kube-apiserver.tmp" "$bin"
echo "scripts/kube-apiserver.sh: built $bin in $(($(date +%s) - start)) s"
echo "$bin" >&3
