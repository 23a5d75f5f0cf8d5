// Package deploy holds what installs the exporter: Kubernetes manifests
// (kubernetes/), the Helm chart (helm/), the Prometheus rules
// (prometheus/), the systemd unit (systemd/). Its own test checks that
// every exporter flag these files and the docs pass exists.
//
// deploy/ is a Go module of its own: its tests need the Helm SDK,
// kustomize, Pod Security admission and csi-test, which the exporter's
// binaries do not import, and the exporter's go.mod names only what they
// do. It replaces the exporter's module with ../ (this checkout).
package deploy
