// Package skips is scripts/gotest.sh's fixture: tests that pass, skip
// (with and without a reason, at the top level and as subtests) and fail.
package skips

import (
	"fmt"
	"os"
	"testing"
)

func TestPasses(t *testing.T) { t.Log("a passing test's line") }

func TestNeedsFrobtool(t *testing.T) {
	t.Log("looking for frobtool")
	t.Skip("frobtool is not installed; apt-get install frobtool")
}

func TestSkipsWithoutReason(t *testing.T) { t.SkipNow() }

func TestSub(t *testing.T) {
	for _, n := range []string{"one", "two"} {
		t.Run(n, func(t *testing.T) {
			t.Parallel()
			if n == "two" {
				t.Skipf("needs root to chown\nsecond line")
			}
			t.Log("a passing subtest's line")
		})
	}
}

func TestFails(t *testing.T) {
	if os.Getenv("GOTEST_FIXTURE_FAIL") == "" {
		return
	}
	fmt.Println("printed by the failing test")
	t.Errorf("wrong: got %d", 1)
}
