package snapshot

import (
	"testing"
)

const snmp = `Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 100
Udp: InDatagrams NoPorts InErrors RcvbufErrors
Udp: 10 3 2 2
`

func TestParseSNMP(t *testing.T) {
	v, err := ParseSNMP([]byte(snmp))
	if err != nil {
		t.Fatal(err)
	}
	if v["Udp.NoPorts"] != 3 || v["Ip.InReceives"] != 100 || v["Udp.RcvbufErrors"] != 2 {
		t.Fatalf("got %v", v)
	}
	if _, err := ParseSNMP([]byte("Udp: InDatagrams NoPorts\nUdp: 1\n")); err == nil {
		t.Fatal("short value line accepted")
	}
}

func TestParseSoftnet(t *testing.T) {
	recs, err := ParseSoftnet(5, []byte("0000000a 00000001 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Device != "cpu1" || recs[0].Values["processed"] != 10 || recs[0].Values["time_squeeze"] != 2 {
		t.Fatalf("got %+v", recs)
	}
	if _, err := ParseSoftnet(0, []byte("zz yy xx\n")); err == nil {
		t.Fatal("non-hex accepted")
	}
}

func FuzzParsers(f *testing.F) {
	f.Add([]byte(snmp))
	f.Add([]byte("0000000a 00000001 00000002\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseSNMP(b)
		_, _ = ParseSoftnet(0, b)
	})
}
