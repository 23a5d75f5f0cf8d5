// Package dashboardtest reads what the tests of dashboards/ and e2e/ both
// need from a Grafana dashboard: a query variable's label_values(selector,
// label) query.
package dashboardtest

import (
	"encoding/json"
	"fmt"
	"regexp"
)

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)

// LabelValues reads a query variable's query (its JSON value, a string) as
// label_values(selector, label).
func LabelValues(query json.RawMessage) (selector, label string, err error) {
	var q string
	if err := json.Unmarshal(query, &q); err != nil {
		return "", "", fmt.Errorf("query is not a string: %s", query)
	}
	m := labelValues.FindStringSubmatch(q)
	if m == nil {
		return "", "", fmt.Errorf("query %q is not label_values(selector, label)", q)
	}
	return m[1], m[2], nil
}
