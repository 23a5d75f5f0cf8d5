package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// The sharded setup of docs/scaling.md, with the real binaries: one
// exporter scraped as shardNodes node targets by one Prometheus (the
// reference), and by two shards that keep half the nodes each (hashmod on
// the target) and evaluate rules.yml and fleet-rules.yml over them; a
// global Prometheus federates the shards' fleet recording rules and
// alerts. The shards together must raise the alerts the one Prometheus
// does, and the fleet dashboard must answer through the global view.
const (
	shardNodes = 6
	shards     = 2
)

// globalMatch is what the global view federates from each shard:
// docs/scaling.md lists it.
const globalMatch = `{__name__=~"instance:gpumem_.+|workload:gpumem_.+|namespace_pod_container:gpumem_.+|gpu:gpumem_memory_used:ratio|process:gpumem_allocator_ooms_total:nonzero|gpumem_allocator_last_oom_(request_bytes|timestamp_seconds)|ALERTS"}`

// shardConfig is a Prometheus configuration that scrapes the exporter as
// shardNodes nodes, keeping shard of every shards (all of them when shards
// is 0), with the rule files.
func shardConfig(exporter string, shard, shards int, ruleFiles ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: %[1]s\n  scrape_timeout: %[1]s\n  evaluation_interval: %[1]s\n", scrapeInterval)
	if shards > 0 {
		fmt.Fprintf(&b, "  external_labels: {shard: '%d'}\n", shard)
	}
	b.WriteString("rule_files:\n")
	for _, f := range ruleFiles {
		fmt.Fprintf(&b, "  - %s\n", f)
	}
	b.WriteString("scrape_configs:\n  - job_name: gpumem\n    honor_labels: true\n    relabel_configs:\n")
	// One exporter stands for every node: each target carries its node's
	// name, which becomes the instance. On a fleet the hash is of
	// __address__, each node's own.
	b.WriteString("      - {source_labels: [node], target_label: instance}\n      - {regex: node, action: labeldrop}\n")
	if shards > 0 {
		fmt.Fprintf(&b, "      - {source_labels: [instance], modulus: %d, target_label: __tmp_shard, action: hashmod}\n", shards)
		fmt.Fprintf(&b, "      - {source_labels: [__tmp_shard], regex: '%d', action: keep}\n", shard)
	}
	b.WriteString("    static_configs:\n")
	for i := 0; i < shardNodes; i++ {
		fmt.Fprintf(&b, "      - {targets: ['%s'], labels: {node: 'gpu-node-%d:9481'}}\n", exporter, i)
	}
	return b.String()
}

// startPrometheus starts a Prometheus with config in s.dir/name and
// returns its URL once it is ready.
func (s *stack) startPrometheus(name, config string) (string, error) {
	dir := filepath.Join(s.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		return "", err
	}
	addr, err := exportertest.FreeAddr()
	if err != nil {
		return "", err
	}
	p, err := s.start(name, "prometheus", "--config.file="+file, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"), "--web.listen-address="+addr)
	if err != nil {
		return "", err
	}
	url := "http://" + addr
	return url, waitReady(p, url+"/-/ready")
}

// alertSet is the alerts a Prometheus raised in the window before at, as
// sorted strings of their labels (shard left out): pending or firing. It
// compares the alerts about pods and Slurm jobs, the ones that group the
// series of several processes (and, for a Slurm job, of several nodes):
// those of a process outside both, and those about one node's GPU, rest
// on single samples of a simulated node that runs 300 times as fast as
// the clock, which two servers scraping at different moments see
// differently (a process that lives less than a scrape, free memory
// crossing a threshold between two scrapes).
func alertSet(ctx context.Context, s *stack, at time.Time, window time.Duration) ([]string, error) {
	res, err := s.query(ctx, fmt.Sprintf(`group by (alertname, workload, namespace, pod, slurm_job_id, cause, instance, gpu, uuid) (last_over_time(ALERTS{workload!="",workload!~".* pid .*"}[%s]))`, promDuration(window)), at)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range res {
		keys := make([]string, 0, len(r.labels))
		for k := range r.labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, k+"="+r.labels[k])
		}
		out = append(out, strings.Join(parts, ","))
	}
	sort.Strings(out)
	return out, nil
}

func TestShardsAndGlobalViewMatchOnePrometheus(t *testing.T) {
	main := requireStack(t)
	if testing.Short() {
		t.Skip("starts four Prometheus servers")
	}
	// Processes of its own, stopped at the end; the exporter is the
	// stack's.
	s := &stack{dir: filepath.Join(main.dir, "shards"), exporterAddr: main.exporterAddr}
	defer s.stop()
	rules, err := rulesEvery(main.dir, "rules.yml", scrapeInterval)
	if err != nil {
		t.Fatal(err)
	}
	fleetRules, err := rulesEvery(main.dir, "fleet-rules.yml", scrapeInterval)
	if err != nil {
		t.Fatal(err)
	}
	one, err := s.startPrometheus("one", shardConfig(s.exporterAddr, 0, 0, rules, fleetRules))
	if err != nil {
		t.Fatal(err)
	}
	var shardAddrs []string
	for i := 0; i < shards; i++ {
		url, err := s.startPrometheus(fmt.Sprintf("shard-%d", i), shardConfig(s.exporterAddr, i, shards, rules, fleetRules))
		if err != nil {
			t.Fatal(err)
		}
		shardAddrs = append(shardAddrs, "'"+strings.TrimPrefix(url, "http://")+"'")
	}
	global, err := s.startPrometheus("global", fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
scrape_configs:
  - job_name: federate
    honor_labels: true
    metrics_path: /federate
    params:
      'match[]': ['%[2]s']
    static_configs:
      - targets: [%[3]s]
`, scrapeInterval, globalMatch, strings.Join(shardAddrs, ", ")))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// exporterAddr is what the dashboards' $instance becomes: every node.
	oneView := &stack{promURL: one, promStart: start, exporterAddr: ".*"}
	globalView := &stack{promURL: global, promStart: start, exporterAddr: ".*"}
	ctx := context.Background()

	// The alerts: wait until the one Prometheus has raised some, then
	// check that each side's alerts of a window are among the other's of
	// that window widened by a few scrapes, before a moment both have
	// ingested (the shards' alerts reach the global view a scrape later):
	// the servers evaluate at moments of their own.
	deadline := start.Add(2 * dataTimeout)
	const window, slack = time.Minute, 3 * scrapeInterval
	for attempt := 0; ; attempt++ {
		time.Sleep(2 * time.Second)
		at := time.Now().Add(-2 * slack)
		var missing []string
		var n int
		for _, dir := range []struct {
			name     string
			from, to *stack
		}{{"one Prometheus", oneView, globalView}, {"the shards through the global view", globalView, oneView}} {
			have, err := alertSet(ctx, dir.from, at, window)
			if err != nil {
				t.Fatal(err)
			}
			other, err := alertSet(ctx, dir.to, at.Add(slack), window+2*slack)
			if err != nil {
				t.Fatal(err)
			}
			in := map[string]bool{}
			for _, a := range other {
				in[a] = true
			}
			for _, a := range have {
				if !in[a] {
					missing = append(missing, dir.name+" only: "+a)
				}
			}
			n = len(have)
		}
		if n > 0 && len(missing) == 0 {
			t.Logf("%d alerts, the same from one Prometheus and from %d shards through the global view (attempt %d)", n, shards, attempt+1)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts differ until %s after the start:\n  %s\n%s%s", 2*dataTimeout, strings.Join(missing, "\n  "), main.logs(), s.logs())
		}
	}

	// The fleet dashboard through the global view: every panel and
	// variable returns data, and the headline figures are the one
	// Prometheus's.
	var fleet []dashboard
	for _, d := range loadDashboards(t) {
		if d.file == "fleet.json" {
			fleet = append(fleet, d)
		}
	}
	if len(fleet) != 1 {
		t.Fatal("no fleet.json")
	}
	pending := map[string]check{}
	for _, c := range allChecks(t, fleet) {
		pending[c.where] = c
	}
	for len(pending) > 0 && time.Now().Before(deadline) {
		now := time.Now()
		for where, c := range pending {
			ok, err := globalView.hasData(ctx, c, now)
			if err != nil {
				t.Fatalf("%s through the global view: %v", where, err)
			}
			if ok {
				delete(pending, where)
			}
		}
		time.Sleep(time.Second)
	}
	for where := range pending {
		t.Errorf("%s: no data through the global view", where)
	}
	// Nodes and GPUs seen in the last 10 s (a scrape of the simulated node
	// under load can time out now and then, on either side).
	at := time.Now().Add(-3 * scrapeInterval)
	for _, q := range []string{`count(max_over_time(instance:gpumem_gpus:count[10s]))`, `sum(max_over_time(instance:gpumem_gpus:count[10s]))`} {
		a, err := oneView.query(ctx, q, at)
		if err != nil {
			t.Fatal(err)
		}
		b, err := globalView.query(ctx, q, at)
		if err != nil {
			t.Fatal(err)
		}
		if len(a) != 1 || len(b) != 1 || a[0].samples[0].v != b[0].samples[0].v {
			t.Errorf("%s: one Prometheus %v, the global view %v", q, a, b)
		}
	}
}
