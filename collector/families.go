package collector

import (
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/exposition"
)

// The data collectors (gpu, process, allocator) export rows: a device, or
// a process on a device. Each row has one set of label values per label
// schema, and each family takes a value from some rows. The same rowSet
// feeds client_golang (collect, the reference and the protobuf path) and
// the text exposition written without client_golang (appendText), so the
// two cannot drift apart; a test compares them on every golden case.

// schema is the label names of some families, as declared, and the order
// in which client_golang writes them: sorted by name.
type schema struct {
	names  []string
	sorted []int // indexes into names, by name
}

func newSchema(names ...string) *schema {
	s := &schema{names: names, sorted: make([]int, len(names))}
	for i := range s.sorted {
		s.sorted[i] = i
	}
	sort.Slice(s.sorted, func(a, b int) bool { return names[s.sorted[a]] < names[s.sorted[b]] })
	return s
}

// family is one metric family of a data collector.
type family struct {
	name, help string
	typ        prometheus.ValueType
	labels     *schema
	desc       *prometheus.Desc
}

func newFamily(name, help string, typ prometheus.ValueType, labels *schema) *family {
	return &family{
		name: name, help: help, typ: typ, labels: labels,
		desc: prometheus.NewDesc(name, help, labels.names, nil),
	}
}

// column is a family and how it takes its value from row i; ok false
// means the row has no sample in this family.
type column struct {
	fam   *family
	value func(i int) (v float64, ok bool)
}

// rowSet is one scrape's rows of a data collector.
type rowSet struct {
	n int
	// labels returns row i's values of s's names, in s's declared order.
	labels  func(i int, s *schema) []string
	columns []column
}

// collect sends the rows as client_golang constant metrics.
func (rs *rowSet) collect(ch chan<- prometheus.Metric) {
	type key struct {
		s *schema
		i int
	}
	cache := map[key][]string{}
	values := func(s *schema, i int) []string {
		k := key{s, i}
		v, ok := cache[k]
		if !ok {
			v = rs.labels(i, s)
			for j := range v {
				v[j] = validUTF8(v[j])
			}
			cache[k] = v
		}
		return v
	}
	for _, c := range rs.columns {
		for i := 0; i < rs.n; i++ {
			if v, ok := c.value(i); ok {
				ch <- prometheus.MustNewConstMetric(c.fam.desc, c.fam.typ, v, values(c.fam.labels, i)...)
			}
		}
	}
}

// labelled is row i's label set in one schema: the text between a metric
// name and its value, and the values in written order, which client_golang
// sorts the series of a family by.
type labelled struct {
	row  int
	text []byte
	key  []string
}

// maxFloatLen is the longest value strconv's shortest 'g' format writes
// ("-2.2250738585072014e-308").
const maxFloatLen = 24

// appendText writes the rows' families in the text exposition format,
// byte for byte as client_golang's registry and expfmt would: families
// sorted by name (the caller sorts across collectors), each family's
// series sorted by label values in label-name order, empty families left
// out. Each row's label set is written once per schema and shared by all
// the families that use it; all the families share one buffer, sized
// before writing.
func (rs *rowSet) appendText(out []exposition.TextFamily) []exposition.TextFamily {
	bySchema := map[*schema][]labelled{}
	size := 0
	for _, c := range rs.columns {
		l, ok := bySchema[c.fam.labels]
		if !ok {
			l = rs.labelSets(c.fam.labels)
			bySchema[c.fam.labels] = l
		}
		size += len(c.fam.name)*2 + len(c.fam.help)*2 + 32
		for i := range l {
			size += len(c.fam.name) + len(l[i].text) + maxFloatLen + 1
		}
	}
	buf := make([]byte, 0, size)
	for _, c := range rs.columns {
		start := len(buf)
		header := false
		for _, l := range bySchema[c.fam.labels] {
			v, ok := c.value(l.row)
			if !ok {
				continue
			}
			if !header {
				buf = appendHeader(buf, c.fam)
				header = true
			}
			buf = append(buf, c.fam.name...)
			buf = append(buf, l.text...)
			buf = appendFloat(buf, v)
			buf = append(buf, '\n')
		}
		if header {
			out = append(out, exposition.TextFamily{Name: c.fam.name, Text: buf[start:len(buf):len(buf)]})
		}
	}
	return out
}

// labelSets writes each row's label set in schema s, sorted as
// client_golang sorts a family's series.
func (rs *rowSet) labelSets(s *schema) []labelled {
	l := make([]labelled, rs.n)
	size := 0
	for i := range l {
		values := rs.labels(i, s)
		key := make([]string, len(s.sorted))
		for k, j := range s.sorted {
			key[k] = validUTF8(values[j])
			size += len(s.names[j]) + len(key[k])*2 + 4 // name="value", escaped at worst
		}
		l[i] = labelled{row: i, key: key}
		size += 3
	}
	buf := make([]byte, 0, size)
	for i := range l {
		start := len(buf)
		for k, j := range s.sorted {
			if k == 0 {
				buf = append(buf, '{')
			} else {
				buf = append(buf, ',')
			}
			buf = append(buf, s.names[j]...)
			buf = append(buf, '=', '"')
			buf = appendLabelValue(buf, l[i].key[k])
			buf = append(buf, '"')
		}
		if len(s.sorted) > 0 {
			buf = append(buf, '}')
		}
		buf = append(buf, ' ')
		l[i].text = buf[start:len(buf):len(buf)]
	}
	slices.SortStableFunc(l, func(a, b labelled) int { return slices.Compare(a.key, b.key) })
	return l
}

// validUTF8 makes s a valid label value. client_golang panics on invalid
// UTF-8; /proc's comm is cleaned where it is read, NVML's process name
// (the fallback) is not.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
