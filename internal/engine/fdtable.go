package engine

import "sync/atomic"

// fdPage is how many fds a page of an fdTable holds.
const fdPage = 256

// fdTable maps the fds below MaxFD to *T: reads take no lock, and a page
// of fdPage entries is allocated when the first fd in it is stored. A
// flat array of MaxFD pointers for each of the engine's four tables was
// 2 MB of heap in every process: the first GC came during the stack's
// open (5 ms of CPU of a short-lived client's), and every GC scanned
// them.
type fdTable[T any] struct {
	pages [MaxFD / fdPage]atomic.Pointer[[fdPage]atomic.Pointer[T]]
}

// Load returns fd's entry, nil if none. fd must be in [0, MaxFD).
func (t *fdTable[T]) Load(fd int) *T {
	if p := t.pages[fd/fdPage].Load(); p != nil {
		return p[fd%fdPage].Load()
	}
	return nil
}

// slot is fd's entry, its page allocated if it had none and alloc is
// set; nil otherwise.
func (t *fdTable[T]) slot(fd int, alloc bool) *atomic.Pointer[T] {
	pp := &t.pages[fd/fdPage]
	p := pp.Load()
	if p == nil {
		if !alloc {
			return nil
		}
		if pp.CompareAndSwap(nil, new([fdPage]atomic.Pointer[T])) {
			p = pp.Load()
		} else {
			p = pp.Load() // another store allocated it first
		}
	}
	return &p[fd%fdPage]
}

// Store sets fd's entry.
func (t *fdTable[T]) Store(fd int, v *T) {
	if s := t.slot(fd, v != nil); s != nil {
		s.Store(v)
	}
}

// Swap sets fd's entry and returns the one before.
func (t *fdTable[T]) Swap(fd int, v *T) *T {
	if s := t.slot(fd, v != nil); s != nil {
		return s.Swap(v)
	}
	return nil
}

// CompareAndSwap sets fd's entry to v if it is old.
func (t *fdTable[T]) CompareAndSwap(fd int, old, v *T) bool {
	if s := t.slot(fd, v != nil); s != nil {
		return s.CompareAndSwap(old, v)
	}
	return old == nil
}
