package exportertest

import (
	"testing"
	"time"
)

// Within polls cond every 20 ms until it holds or timeout passes, and says
// which.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// Eventually fails the test when cond does not hold within timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("no %s within %s", what, timeout)
	}
}
