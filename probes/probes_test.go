package probes

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"reflect"
	"testing"

	"github.com/vmaxdp/vmaxdp/bpf"
	"github.com/vmaxdp/vmaxdp/tracefile"
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

// The trace file decodes events in bpf/nettrace.c's struct event layout
// (through its bpf2go mirror): a reordered C field must fail here, not
// become garbage in every recording.
func TestEventLayout(t *testing.T) {
	in := bpf.NettraceEvent{Ts: 1, Skb: 2, Location: 3, Sk: 4, Pid: 5, Tid: 6, Cpu: 7, Netns: 8, Ifindex: 9, Len: 10,
		Reason: 11, Probe: 12, Protocol: 13, Arg: [4]int32{-14, 15, 16, 17}, Caplen: 3, Flags: 18}
	copy(in.Data[:], []byte{19, 20, 21})
	in.Comm[0], in.Dev[0] = 'c', 'd'
	var buf bytes.Buffer
	if err := binary.Write(&buf, tracefile.ByteOrder, &in); err != nil {
		t.Fatal(err)
	}
	if got := buf.Len() - tracefile.MaxCapLen; got != tracefile.EventHeadSize {
		t.Fatalf("struct event head is %d bytes, tracefile.EventHeadSize %d", got, tracefile.EventHeadSize)
	}
	var e tracefile.Event
	if err := tracefile.DecodeRawEvent(buf.Bytes(), &e); err != nil {
		t.Fatal(err)
	}
	want := tracefile.Event{Time: 1, Skb: 2, Location: 3, Sk: 4, PID: 5, TID: 6, CPU: 7, Netns: 8, Ifindex: 9, Len: 10,
		Reason: 11, Probe: 12, Protocol: 13, Arg: [4]int32{-14, 15, 16, 17}, Flags: 18, Data: []byte{19, 20, 21}}
	want.Comm[0], want.Dev[0] = 'c', 'd'
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("decoded %+v\nwant    %+v", e, want)
	}
}
