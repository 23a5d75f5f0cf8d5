package dashboardtest

import "testing"

func TestLabelValuesReadsTheSelectorAndTheLabel(t *testing.T) {
	for _, tc := range []struct {
		query, selector, label string
		fails                  bool
	}{
		{`"label_values(gpumem_gpu_info{job=\"$job\"}, gpu)"`, `gpumem_gpu_info{job="$job"}`, "gpu", false},
		{`"label_values(workload:gpumem_used_bytes:sum,  namespace)"`, "workload:gpumem_used_bytes:sum", "namespace", false},
		{`"query_result(up)"`, "", "", true},
		{`{"query": "label_values(up, job)"}`, "", "", true},
	} {
		selector, label, err := LabelValues([]byte(tc.query))
		if (err != nil) != tc.fails || selector != tc.selector || label != tc.label {
			t.Errorf("LabelValues(%s) = %q, %q, %v; want %q, %q, failing %v", tc.query, selector, label, err, tc.selector, tc.label, tc.fails)
		}
	}
}
