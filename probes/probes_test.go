package probes

import (
	"errors"
	"os"
	"testing"
)

func TestSelect(t *testing.T) {
	drops, err := Select("drops")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range drops {
		names[p.Name] = true
	}
	for _, want := range []string{"skb:kfree_skb", "udp:udp_fail_queue_rcv_skb", "sock:sock_rcvqueue_full", "xdp:xdp_redirect_err"} {
		if !names[want] {
			t.Errorf("group drops lacks %s", want)
		}
	}
	if all, _ := Select("all"); len(all) != len(All) {
		t.Errorf("all selects %d of %d", len(all), len(All))
	}
	one, err := Select("kfree_skb,skb:kfree_skb,rx")
	if err != nil || one[0].ID != NetifReceiveSkb {
		t.Errorf("mixed selection: %v, %v", one, err)
	}
	if _, err := Select("nosuch"); err == nil {
		t.Error("unknown event accepted")
	}
	for i, p := range All {
		if int(p.ID) != i {
			t.Errorf("All[%d] is %s with ID %d: the table must follow enum probe_id", i, p.Name, p.ID)
		}
	}
}

// Every probe's argument list matches the running kernel's BTF; a wrong
// expectation is refused, not attached with wrong fields.
func TestCheckArgs(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skip("kernel BTF missing:", err)
	}
	for i := range All {
		if err := checkArgs(&All[i]); err != nil {
			t.Errorf("%s: %v", All[i].Name, err)
		}
	}
	bad := All[KfreeSkb]
	bad.Args = []string{"*sk_buff", "*", "int"}
	if err := checkArgs(&bad); !errors.Is(err, ErrNotSupported) {
		t.Errorf("kfree_skb read with an int reason: %v, want ErrNotSupported", err)
	}
	reasons, source, err := DropReasons()
	if err != nil || reasons[3] != "NO_SOCKET" || source != "btf" {
		t.Errorf("drop reasons: %d names from %q, reason 3 = %q, err %v", len(reasons), source, reasons[3], err)
	}
}
