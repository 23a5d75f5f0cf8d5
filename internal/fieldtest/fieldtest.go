// Package fieldtest checks that a comparison sees every field of a struct:
// the caches on the scrape path compare what they were built from field by
// field, and a field added later that the comparison ignores would serve a
// stale scrape. Its tests build, for each field reachable from a type
// (through structs, pointers and slices), two values that differ in that
// field alone, and require the comparison to tell them apart.
package fieldtest

import (
	"fmt"
	"reflect"
	"time"
)

// Variant is a value that differs from Fields' base in one place.
type Variant[T any] struct {
	// Path names the place: a field path such as "Alloc.Active.V",
	// "Devices[0].Processes[0].PID", "Alloc=nil" (a pointer left nil) or
	// "Devices=len2" (a slice one element longer).
	Path  string
	Value T
}

// Fields returns a base value of T, with every pointer set, every slice one
// element long and every exported leaf field non-zero; one variant per
// exported leaf, pointer and slice reachable from it; and the paths of the
// unexported fields, which it leaves zero. Every call builds new values:
// base and variants share no memory. It panics on a type it cannot fill
// (a map, func, channel or interface).
func Fields[T any]() (base T, variants []Variant[T], unexported []string) {
	var places []string
	t := reflect.TypeFor[T]()
	b := fill(t, "", "", &places, &unexported)
	base = b.Interface().(T)
	for _, p := range places {
		v := fill(t, "", p, nil, nil)
		variants = append(variants, Variant[T]{Path: p, Value: v.Interface().(T)})
	}
	return base, variants, unexported
}

var timeType = reflect.TypeFor[time.Time]()

// fill builds a value of t at path: the base value, except at target.
// places and unexported, when not nil, collect what can vary.
func fill(t reflect.Type, path, target string, places, unexported *[]string) reflect.Value {
	v := reflect.New(t).Elem()
	changed := path == target
	note := func(p string) {
		if places != nil {
			*places = append(*places, p)
		}
	}
	switch {
	case t == timeType:
		note(path)
		at := time.Unix(1_700_000_000, 0)
		if changed {
			at = at.Add(time.Second)
		}
		v.Set(reflect.ValueOf(at))
		return v
	case t.Kind() == reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			p := join(path, f.Name)
			if !f.IsExported() {
				if unexported != nil {
					*unexported = append(*unexported, p)
				}
				continue
			}
			v.Field(i).Set(fill(f.Type, p, target, places, unexported))
		}
		return v
	case t.Kind() == reflect.Pointer:
		note(path + "=nil")
		if target == path+"=nil" {
			return v
		}
		elem := reflect.New(t.Elem())
		elem.Elem().Set(fill(t.Elem(), path, target, places, unexported))
		v.Set(elem)
		return v
	case t.Kind() == reflect.Slice:
		note(path + "=len2")
		n := 1
		if target == path+"=len2" {
			n = 2
		}
		s := reflect.MakeSlice(t, n, n)
		s.Index(0).Set(fill(t.Elem(), path+"[0]", target, places, unexported))
		if n == 2 {
			s.Index(1).Set(fill(t.Elem(), path+"[0]", "", nil, nil))
		}
		v.Set(s)
		return v
	}
	note(path)
	one := int64(1)
	if changed {
		one = 2
	}
	switch t.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprint("s", one))
	case reflect.Bool:
		v.SetBool(!changed)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(one)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		v.SetUint(uint64(one))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(one))
	default:
		panic(fmt.Sprintf("fieldtest: cannot fill %s (%s)", path, t))
	}
	return v
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
