// Package kubernetes holds the Kubernetes manifests of gpumem_exporter (a
// DaemonSet, its RBAC, a headless Service and a ServiceMonitor, applied with
// `kubectl apply -k deploy/kubernetes`) and, in its tests, the checks that
// keep them consistent with each other and with the exporter's flags. It has
// no Go API; see README.md in this directory.
package kubernetes
