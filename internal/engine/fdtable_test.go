package engine

import (
	"runtime"
	"sync"
	"testing"
)

// An fdTable allocates a page for a stored entry only: nil stores, swaps
// and compare-and-swaps on an empty page allocate nothing and behave as
// on a nil entry; concurrent stores into one new page all land.
func TestFDTable(t *testing.T) {
	var tab fdTable[int]
	v := new(int)
	tab.Store(700, nil)
	if got := tab.Swap(701, nil); got != nil {
		t.Errorf("Swap on an empty page = %v, want nil", got)
	}
	if !tab.CompareAndSwap(702, nil, nil) || tab.CompareAndSwap(703, v, nil) {
		t.Error("CompareAndSwap on an empty page: want true from nil, false from an entry")
	}
	if tab.pages[700/fdPage].Load() != nil {
		t.Error("a nil store allocated a page")
	}
	if !tab.CompareAndSwap(MaxFD-1, nil, v) || tab.Load(MaxFD-1) != v {
		t.Error("CompareAndSwap into a new page did not store")
	}
	var wg sync.WaitGroup
	vals := make([]int, fdPage)
	for i := range fdPage {
		wg.Go(func() { tab.Store(3*fdPage+i, &vals[i]) })
	}
	wg.Wait()
	for i := range fdPage {
		if tab.Load(3*fdPage+i) != &vals[i] {
			t.Fatalf("fd %d: lost its store", 3*fdPage+i)
		}
	}
}

// An engine's fd tables cost the heap nothing until fds are stored (they
// were 2 MB, and brought a short-lived client's first GC forward).
func TestNewHeap(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	engineFor(t)
	runtime.ReadMemStats(&after)
	n := after.TotalAlloc - before.TotalAlloc
	t.Logf("New allocated %d KB", n>>10)
	if n > 512<<10 {
		t.Errorf("New allocated %d KB, want under 512", n>>10)
	}
}
