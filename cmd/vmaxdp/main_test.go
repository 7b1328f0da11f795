package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
)

func TestVersionAndUsage(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out); err != nil || !strings.HasPrefix(out.String(), "vmaxdp ") {
		t.Fatalf("version: %q %v", out.String(), err)
	}
	for _, args := range [][]string{nil, {"nope"}, {"testbed"}, {"testbed", "sideways"}, {"bench", "nope"}} {
		if err := run(context.Background(), args, &out); !errors.Is(err, errUsage) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
}

func TestTestbedCommands(t *testing.T) {
	testutil.RequireRoot(t)
	var out bytes.Buffer
	name := "clitest"
	t.Cleanup(func() { run(context.Background(), []string{"testbed", "down", "-name", name}, &out) })
	for _, args := range [][]string{{"testbed", "up", "-name", name, "-queues", "2"}, {"testbed", "status"}, {"testbed", "down", "-name", name}} {
		out.Reset()
		if err := run(context.Background(), args, &out); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if args[1] == "status" && !strings.Contains(out.String(), "clitest: vmx-clitest-a 198.18.0.1 <-> vmx-clitest-b 198.18.0.2, 2 queue(s)") {
			t.Errorf("status: %q", out.String())
		}
	}
}
