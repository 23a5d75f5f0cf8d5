// Package kubernetes holds the Kubernetes manifests of gpumem_exporter (a
// DaemonSet with the exporter, its CSI node plugin and the plugin's
// registrar, the CSIDriver, RBAC, a headless Service, a ServiceMonitor, a
// PrometheusRule and dashboard ConfigMaps, applied with
// `kubectl apply -k deploy/kubernetes`) and, in its tests, the checks that
// hold them to the deployment contract of docs/deploy.md. The checks live in
// manifestcheck, which the Helm chart's tests (deploy/helm) share. It has no
// Go API; see README.md in this directory.
package kubernetes
