package bench_test

import (
	"os"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/bench"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// Every kind of `vmaxdp bench` runs and measures something on both sides.
// Rates are not asserted: the machine is shared and noisy.
func TestEveryKindRuns(t *testing.T) {
	bed := testutil.Bed(t, nil)
	o := &bench.Options{Duration: 300 * time.Millisecond}
	for name, f := range map[string]func(*testbed.Bed, *bench.Options) (bench.Result, error){
		"rxdrop": bench.RxDrop, "txonly": bench.TxOnly, "echo": bench.Echo, "xdpcost": bench.XDPCost,
	} {
		r, err := f(bed, o)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.Kernel <= 0 || r.Vmaxdp <= 0 {
			t.Errorf("%s measured nothing: %v", name, r)
		}
		t.Log(r)
	}
}
