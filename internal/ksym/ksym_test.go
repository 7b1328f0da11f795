package ksym

import (
	"errors"
	"strings"
	"testing"
)

func TestParseLookup(t *testing.T) {
	tab, err := Parse(strings.NewReader("ffffffff81000200 T b_func\nffffffff81000100 t a_func\nffffffff81000300 D data\nffffffffc0000000 t mod_func\t[veth]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := tab.Lookup(0xffffffff81000210); !ok || s.Name != "b_func" {
		t.Fatalf("lookup = %+v %v", s, ok)
	}
	if s, ok := tab.Lookup(0xffffffffc0000010); !ok || s.Module != "veth" {
		t.Fatalf("module lookup = %+v %v", s, ok)
	}
	if _, ok := tab.Lookup(0x10); ok {
		t.Fatal("address below every symbol resolved")
	}
	if _, err := Parse(strings.NewReader("0000000000000000 T a\n0000000000000000 T b\n")); !errors.Is(err, ErrHidden) {
		t.Fatalf("hidden addresses: %v", err)
	}
	if _, err := Parse(strings.NewReader("xyz T a\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("bad address: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("ffffffff81000200 T b_func\nffffffffc0000000 t mod_func\t[veth]\n")
	f.Fuzz(func(t *testing.T, s string) {
		tab, err := Parse(strings.NewReader(s))
		if err == nil {
			tab.Lookup(0xffffffff81000000)
		}
	})
}
