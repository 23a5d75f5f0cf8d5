package exportertest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families parses a scrape in the text format.
func Families(body string) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing a scrape: %w", err)
	}
	return fams, nil
}

// MetricIn returns the value of the first series in body whose line before
// the value matches re (anchored at the line's start), or -1.
func MetricIn(body, re string) float64 {
	m := regexp.MustCompile(`(?m)^` + re + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}

// SumMetric sums the values of every series in body matching re.
func SumMetric(body, re string) float64 {
	var sum float64
	for _, m := range regexp.MustCompile(`(?m)^`+re+` (\S+)$`).FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}

// GrepLines returns the sample lines of body that contain one of subs, for
// a failure message.
func GrepLines(body string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
