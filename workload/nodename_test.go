package workload

import (
	"os"
	"testing"
)

func TestNodeNameIsTheFlagElseTheHostName(t *testing.T) {
	if got := NodeName("gpu-node-7"); got != "gpu-node-7" {
		t.Errorf("NodeName(flag) = %q, want the flag's value", got)
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	if got := NodeName(""); got != host {
		t.Errorf("NodeName(\"\") = %q, want the host name %q", got, host)
	}
}
