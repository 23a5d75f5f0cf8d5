// Package deploy holds what installs the exporter: Kubernetes manifests
// (kubernetes/), the Helm chart (helm/), the Prometheus rules
// (prometheus/), the systemd unit (systemd/). Its own test checks that
// every exporter flag these files and the docs pass exists.
package deploy
