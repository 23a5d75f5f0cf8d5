package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// shellBlocks returns the ```sh blocks of a Markdown file, each with its
// continuation lines joined and its comments and indentation dropped.
func shellBlocks(t *testing.T, path string) [][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		var lines []string
		joined := strings.ReplaceAll(m[1], "\\\n", " ")
		for _, l := range strings.Split(joined, "\n") {
			l = strings.Join(strings.Fields(l), " ")
			if l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		blocks = append(blocks, lines)
	}
	return blocks
}

// The Helm quick start of the README and of docs/deploy.md works as
// written on a cluster where the user can push an image: it builds the
// image from the Dockerfile and pushes it, installs the chart with that
// image, and gives the namespace the Pod Security level the exporter pod
// needs (hostPID, hostPath, the privileged CSI plugin). Both say the same.
func TestHelmQuickStartWorksAsWritten(t *testing.T) {
	install := regexp.MustCompile(`^helm install \S+ (deploy/helm/\S+) -n (\S+) (.*)$`)
	build := regexp.MustCompile(`^docker build -t (\S+):(\S+) .*\.$`)
	var steps [][]string
	for _, doc := range []string{"../README.md", "../docs/deploy.md"} {
		var found []string
		for _, block := range shellBlocks(t, doc) {
			for _, l := range block {
				if strings.HasPrefix(l, "helm install ") {
					found = block
				}
			}
		}
		if found == nil {
			t.Errorf("%s has no shell block with helm install", doc)
			continue
		}
		steps = append(steps, found)
		text := strings.Join(found, "\n")
		var image, tag, chart, ns string
		for _, l := range found {
			if m := build.FindStringSubmatch(l); m != nil {
				image, tag = m[1], m[2]
			}
			if m := install.FindStringSubmatch(l); m != nil {
				chart, ns = m[1], m[2]
				if !strings.Contains(m[3], "--set image.repository="+image+" ") || !strings.Contains(m[3], "--set image.tag="+tag) {
					t.Errorf("%s: helm install does not use the image it built (%s:%s): %s", doc, image, tag, l)
				}
			}
		}
		if image == "" {
			t.Errorf("%s: the Helm quick start does not build the image from the Dockerfile (docker build -t IMAGE:TAG .):\n%s", doc, text)
		}
		if !strings.Contains(text, "docker push "+image+":"+tag) {
			t.Errorf("%s: the Helm quick start does not push %s:%s:\n%s", doc, image, tag, text)
		}
		if _, err := os.Stat("../" + chart + "/Chart.yaml"); chart == "" || err != nil {
			t.Errorf("%s: helm install names chart %q, which is not in the repository", doc, chart)
		}
		if !strings.Contains(text, "kubectl label namespace "+ns+" pod-security.kubernetes.io/enforce=privileged") {
			t.Errorf("%s: the Helm quick start does not label namespace %q pod-security.kubernetes.io/enforce=privileged:\n%s", doc, ns, text)
		}
		if i, j := strings.Index(text, "docker push"), strings.Index(text, "helm install"); i > j {
			t.Errorf("%s: helm install comes before the image is pushed:\n%s", doc, text)
		}
	}
	if len(steps) == 2 && strings.Join(steps[0], "\n") != strings.Join(steps[1], "\n") {
		t.Errorf("the README's Helm quick start differs from docs/deploy.md's:\n%s\n---\n%s", strings.Join(steps[0], "\n"), strings.Join(steps[1], "\n"))
	}
}

// The README's "Test it" says what a newcomer needs: the command, that
// skipped tests are listed, and how long .ci/run took on a fresh clone, in
// one sentence rather than a table; and where the kube-apiserver is
// cached is where scripts/kube-apiserver.sh keeps it.
func TestReadmeTestItIsTrue(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start, end := strings.Index(readme, "## Test it"), strings.Index(readme, "## Instrument a training process")
	if start < 0 || end < start {
		t.Fatal(`README.md has no "## Test it" section before "## Instrument a training process"`)
	}
	section := readme[start:end]
	if regexp.MustCompile(`(?m)^\|`).MatchString(section) {
		t.Error(`README's "Test it" has a table; one measured sentence says how long .ci/run takes`)
	}
	if n := len(strings.Split(section, "\n")); n > 45 {
		t.Errorf(`README's "Test it" is %d lines; keep it short enough for a newcomer to read (at most 45)`, n)
	}
	for _, want := range []string{"make test", "skipped test and its reason", "fresh clone"} {
		if !strings.Contains(section, want) {
			t.Errorf(`README's "Test it" does not say %q`, want)
		}
	}
	if !regexp.MustCompile(`took \d+ min \d+ s`).MatchString(section) {
		t.Error(`README's "Test it" does not say how long .ci/run took ("took N min N s")`)
	}
	script, err := os.ReadFile("../scripts/kube-apiserver.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(section, "~/.cache/gpumem_exporter/") || !strings.Contains(string(script), "${XDG_CACHE_HOME:-$HOME/.cache}/gpumem_exporter") {
		t.Error("README's kube-apiserver cache (~/.cache/gpumem_exporter/) is not where scripts/kube-apiserver.sh keeps it")
	}
}
