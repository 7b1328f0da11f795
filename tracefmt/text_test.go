package tracefmt

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

// TestLossLines checks that both kinds of loss are marked where the
// recorder noticed them and summed at the end: a full ring buffer on one
// CPU, and nested hits the kernel skipped (tracefile.CPUAny).
func TestLossLines(t *testing.T) {
	var buf bytes.Buffer
	m := &tracefile.Meta{Tool: "nettrace", Mode: "events", CapLen: 128,
		Probes: []tracefile.Probe{{ID: uint16(probes.KfreeSkb), Name: "kfree_skb", Attach: "tp_btf"}}}
	w, err := tracefile.NewWriter(&buf, m)
	if err != nil {
		t.Fatal(err)
	}
	kfree := uint16(probes.KfreeSkb)
	w.WriteJSON(tracefile.TypeLoss, tracefile.Loss{Time: 2e9, Entries: []tracefile.LossEntry{
		{Probe: kfree, CPU: 1, Events: 10, Lost: 3},
		{Probe: kfree, CPU: tracefile.CPUAny, Events: 2, Lost: 2},
	}})
	w.WriteJSON(tracefile.TypeLoss, tracefile.Loss{Time: 3e9, Entries: []tracefile.LossEntry{
		{Probe: kfree, CPU: tracefile.CPUAny, Events: 7, Lost: 7},
	}})
	end := &tracefile.End{Probes: []tracefile.ProbeTotals{{Probe: kfree, Events: 17, Lost: 10}}}
	if err := w.Close(end); err != nil {
		t.Fatal(err)
	}
	r, err := tracefile.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	st, err := Text(&out, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# LOST 3 kfree_skb events on cpu 1 before ",
		"# LOST 2 kfree_skb events before ",
		"# LOST 5 kfree_skb events before ",
		"(nested: the probe was already running on that cpu)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("script output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "cpu 4294967295") {
		t.Errorf("nested losses printed with a CPU:\n%s", out.String())
	}
	if st.Lost != 10 {
		t.Errorf("summed %d lost, want 10", st.Lost)
	}
}
