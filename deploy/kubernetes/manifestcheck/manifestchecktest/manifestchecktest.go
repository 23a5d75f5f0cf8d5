// Package manifestchecktest holds what the deployment's tests (deploy/helm,
// deploy/kubernetes) share to report manifestcheck's findings through a
// testing.T; manifestcheck itself does not import testing.
package manifestchecktest

import (
	"testing"

	"github.com/gpumem/gpumem_exporter/deploy/kubernetes/manifestcheck"
)

// One returns the only object of Go type T in objs, failing t otherwise.
func One[T any](t testing.TB, objs []manifestcheck.Object) *T {
	t.Helper()
	obj, err := manifestcheck.One[T](objs)
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// Report fails t with what a check found wrong, if anything.
func Report(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Error(err)
	}
}
