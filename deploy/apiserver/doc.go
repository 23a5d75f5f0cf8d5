// Package apiserver holds only tests: they start a real kube-apiserver (built
// by scripts/kube-apiserver.sh) on etcd, with RBAC and Pod Security
// admission, and check there what the tests of deploy/kubernetes and
// deploy/helm can only check offline: that the kustomization and the Helm
// chart apply server-side with strict field validation, that the example
// workload is admitted in a "restricted" namespace, and that the exporter's
// ServiceAccount may list and watch pods and nothing else.
//
// Without the binaries the tests skip, unless GPUMEM_REQUIRE_APISERVER=1
// (as in .ci/run). See docs/deploy.md, "Testing".
package apiserver
