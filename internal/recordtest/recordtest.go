// Package recordtest records real kernel events on a test bed for tests:
// it runs the recorder while a test's traffic flows and hands back the
// trace file. It must only be imported by tests.
package recordtest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/record"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/report"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

// NetnsInode returns the inode of one side's network namespace, the
// recorder's -netns filter.
func NetnsInode(t testing.TB, b *testbed.Bed, s testbed.Side) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(b.NS(s)), &st); err != nil {
		t.Fatal(err)
	}
	return uint32(st.Ino)
}

// Select resolves an event spec or fails the test.
func Select(t testing.TB, spec string) []*probes.Probe {
	t.Helper()
	p, err := probes.Select(spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// While records with opts (snapshots every 200 ms) while traffic runs,
// then returns the file. A kernel without the probes skips the test.
func While(t testing.TB, opts *record.Options, traffic func() error) []byte {
	t.Helper()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ready := make(chan struct{})
	opts.Ready = func([]string) { close(ready) }
	opts.Interval = 200 * time.Millisecond
	var buf bytes.Buffer
	done := make(chan error, 1)
	go func() {
		_, err := record.Run(ctx, &buf, opts)
		done <- err
	}()
	select {
	case <-ready:
	case err := <-done:
		testutil.SkipIfNotSupported(t, err)
		t.Fatal("recorder stopped before it was ready")
	case <-time.After(30 * time.Second):
		t.Fatal("recorder not ready after 30 s")
	}
	terr := traffic()
	time.Sleep(300 * time.Millisecond) // let the last events and a snapshot land
	cancel(errors.New("test done"))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if terr != nil {
		t.Fatal(terr)
	}
	return buf.Bytes()
}

// Report builds the report of a recording and logs its text.
func Report(t testing.TB, data []byte) *report.Report {
	t.Helper()
	r, err := tracefile.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := report.Build(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	rep.WriteText(&text)
	t.Logf("report:\n%s", text.String())
	return rep
}
