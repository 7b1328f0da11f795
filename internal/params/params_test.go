package params

import (
	"strings"
	"testing"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestLoad(t *testing.T) {
	p, err := Load(env("VMAXDP_RX_POLL", "-1", "VMAXDP_SELECT_POLL", "0", "VMAXDP_OFFLOADED_SOCKETS", "0", "VMAXDP_LOG_FILE", "/tmp/v.%d.log"))
	if err != nil {
		t.Fatal(err)
	}
	if p.RxPoll != -1 || p.SelectPoll != 0 || p.OffloadedSockets || p.RxBytesMin != 65536 || p.LogPath(42) != "/tmp/v.42.log" {
		t.Errorf("parsed %+v", p)
	}
	var b strings.Builder
	p.WriteBanner(&b, "")
	out := b.String()
	for _, want := range []string{"[VMAXDP_TRACELEVEL]", "[VMAXDP_LOG_FILE]", "[VMAXDP_RX_POLL]", "[VMAXDP_OFFLOADED_SOCKETS]"} {
		if !strings.Contains(out, want) {
			t.Errorf("banner lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "[VMAXDP_RX_BYTES_MIN]") {
		t.Errorf("banner shows a parameter at its default:\n%s", out)
	}
}

func TestLoadErrors(t *testing.T) {
	_, err := Load(env("VMAXDP_RX_POLL", "x", "VMAXDP_TRACELEVEL", "7", "VMAXDP_OFFLOADED_SOCKETS", "yes", "VMAXDP_LOG_FILE", "%s%d", "VMAXDP_XDP_MODE", "turbo"))
	for _, want := range []string{`VMAXDP_RX_POLL: "x" is not an integer`, "VMAXDP_TRACELEVEL: 7 is out of range 0..6",
		`VMAXDP_OFFLOADED_SOCKETS: "yes": want 0 or 1`, "VMAXDP_LOG_FILE: only a single %d", `VMAXDP_XDP_MODE: "turbo"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err %v lacks %q", err, want)
		}
	}
}

func TestDocListsAll(t *testing.T) {
	var b strings.Builder
	WriteDoc(&b)
	for _, d := range All {
		if !strings.Contains(b.String(), Prefix+d.Name+" (default ") {
			t.Errorf("doc lacks %s", d.Name)
		}
	}
}

// TestSpecLatency: the latency profile polls for ever and batches Go's
// sysmon, and what is set explicitly wins over it.
func TestSpecLatency(t *testing.T) {
	p, err := Load(env("VMAXDP_SPEC", "latency"))
	if err != nil {
		t.Fatal(err)
	}
	if p.RxPoll != -1 || p.SelectPoll != -1 || !p.SysmonBatch {
		t.Errorf("latency: RxPoll %d SelectPoll %d SysmonBatch %v; want -1, -1, true", p.RxPoll, p.SelectPoll, p.SysmonBatch)
	}
	p, err = Load(env("VMAXDP_SPEC", "latency", "VMAXDP_SYSMON_BATCH", "0", "VMAXDP_RX_POLL", "10"))
	if err != nil {
		t.Fatal(err)
	}
	if p.RxPoll != 10 || p.SelectPoll != -1 || p.SysmonBatch {
		t.Errorf("latency with two set: RxPoll %d SelectPoll %d SysmonBatch %v; want 10, -1, false", p.RxPoll, p.SelectPoll, p.SysmonBatch)
	}
	if p, _ := Load(env()); p.SysmonBatch {
		t.Error("SysmonBatch on by default")
	}
}
