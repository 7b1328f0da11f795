// Package ksym resolves kernel addresses to symbols from /proc/kallsyms,
// so that a recorder can store the symbols of the locations it saw. It
// must not be used on the event path before a location is known to be new:
// lookups are a binary search, loading reads the whole table.
package ksym

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/vmaxdp/vmaxdp/tracefile"
)

// ErrHidden: kallsyms shows zero addresses (kptr_restrict, or not root).
var ErrHidden = errors.New("kernel addresses hidden in /proc/kallsyms (kptr_restrict or missing CAP_SYSLOG)")

// Table is a sorted kernel symbol table.
type Table struct {
	syms []tracefile.Symbol
}

// Load reads /proc/kallsyms.
func Load() (*Table, error) {
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("/proc/kallsyms: %w", err)
	}
	return t, nil
}

// Parse reads a kallsyms table: "addr type name [module]" per line. Only
// text symbols (t, T, w, W) are kept: locations are code addresses.
func Parse(r io.Reader) (*Table, error) {
	t := &Table{}
	sc := bufio.NewScanner(r)
	line, nonzero := 0, false
	for sc.Scan() {
		line++
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 {
			return nil, fmt.Errorf("line %d: %q: want address, type and name", line, sc.Text())
		}
		switch fields[1] {
		case "t", "T", "w", "W":
		default:
			continue
		}
		addr, err := strconv.ParseUint(fields[0], 16, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: address %q: %w", line, fields[0], err)
		}
		nonzero = nonzero || addr != 0
		s := tracefile.Symbol{Addr: addr, Name: fields[2]}
		if len(fields) > 3 {
			s.Module = strings.Trim(fields[3], "[]")
		}
		t.syms = append(t.syms, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.syms) > 0 && !nonzero {
		return nil, ErrHidden
	}
	sort.SliceStable(t.syms, func(i, j int) bool { return t.syms[i].Addr < t.syms[j].Addr })
	return t, nil
}

// Lookup returns the symbol containing addr: the one with the highest
// address not above it.
func (t *Table) Lookup(addr uint64) (tracefile.Symbol, bool) {
	i := sort.Search(len(t.syms), func(i int) bool { return t.syms[i].Addr > addr })
	if i == 0 {
		return tracefile.Symbol{}, false
	}
	return t.syms[i-1], true
}
