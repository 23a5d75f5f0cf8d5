// Package helm holds gpumem_exporter's Helm chart (gpumem-exporter/) and,
// in its tests, the checks that load, lint and render the chart with the
// Helm SDK for several values files and hold every rendered object to the
// deployment contract that the kustomization in deploy/kubernetes also
// follows (see docs/deploy.md). It has no Go API.
package helm
