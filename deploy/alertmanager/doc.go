// Package alertmanager holds an example Alertmanager configuration for the
// alerts of deploy/prometheus/rules.yml (alertmanager.yml: grouping by
// workload, routing by namespace and severity, inhibitions) that a user
// copies. It has no Go code of its own: its tests check the example with
// amtool and against a real Alertmanager.
package alertmanager
