package fieldtest

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

type inner struct {
	N    uint64
	OK   bool
	When time.Time
}

type outer struct {
	Name   string
	In     inner
	Ptr    *inner
	List   []inner
	hidden int
}

func TestFieldsVariesEachPlaceAlone(t *testing.T) {
	base, variants, unexported := Fields[outer]()
	var paths []string
	for _, v := range variants {
		paths = append(paths, v.Path)
		if reflect.DeepEqual(base, v.Value) {
			t.Errorf("variant %s equals the base", v.Path)
		}
	}
	want := []string{"Name", "In.N", "In.OK", "In.When", "Ptr=nil", "Ptr.N", "Ptr.OK", "Ptr.When", "List=len2", "List[0].N", "List[0].OK", "List[0].When"}
	if !slices.Equal(paths, want) {
		t.Errorf("variants %q, want %q", paths, want)
	}
	if !slices.Equal(unexported, []string{"hidden"}) {
		t.Errorf("unexported %q, want [hidden]", unexported)
	}
	again, _, _ := Fields[outer]()
	if !reflect.DeepEqual(base, again) || base.Ptr == again.Ptr || &base.List[0] == &again.List[0] {
		t.Error("two bases are not equal values in memory of their own")
	}
}
