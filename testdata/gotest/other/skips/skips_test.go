// Package skips is scripts/gotest.sh's fixture of a second module (as
// deploy/ is the repository's): a package whose name the first module's
// fixture has too, with a test that skips and one that fails on demand.
package skips

import (
	"os"
	"testing"
)

func TestNeedsEtcd(t *testing.T) { t.Skip("etcd is not installed") }

func TestFailsInTheOtherModule(t *testing.T) {
	if os.Getenv("GOTEST_FIXTURE_FAIL_OTHER") != "" {
		t.Error("failed in the other module")
	}
}
