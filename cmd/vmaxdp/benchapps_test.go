package main

import (
	"slices"
	"testing"

	"github.com/vmaxdp/vmaxdp/internal/apps"
)

// TestAppEnv: a TCP application's vmaxdp sides run with TCP offload on
// unless -env says otherwise; a UDP one's env is what -env gave. Before,
// `bench apps -apps memcached-tcp` without `-env VMAXDP_TCP=1` measured
// the kernel's TCP under the interposer, and a session took its ratios
// (1.03/0.89/0.93x) for TCP offload's (0.32/0.33/0.20x).
func TestAppEnv(t *testing.T) {
	tcp, udp := apps.TCP[0], apps.All[0]
	for _, tc := range []struct {
		app       *apps.App
		env, want []string
	}{
		{tcp, nil, []string{"VMAXDP_TCP=1"}},
		{tcp, []string{"VMAXDP_RX_POLL=0"}, []string{"VMAXDP_RX_POLL=0", "VMAXDP_TCP=1"}},
		{tcp, []string{"VMAXDP_TCP=0"}, []string{"VMAXDP_TCP=0"}},
		{udp, nil, nil},
		{udp, []string{"VMAXDP_TCP=1"}, []string{"VMAXDP_TCP=1"}},
	} {
		env := slices.Clone(tc.env)
		if got := appEnv(tc.app, env); !slices.Equal(got, tc.want) {
			t.Errorf("appEnv(%s, %q) = %q, want %q", tc.app.Name, tc.env, got, tc.want)
		}
		if !slices.Equal(env, tc.env) {
			t.Errorf("appEnv(%s) changed the env it was given: %q", tc.app.Name, env)
		}
	}
}
