// Package params holds vmaxdp's run-time parameters: the VMAXDP_*
// environment variables that configure an application run under
// `vmaxdp run` (VMA's VMA_* parameters, with VMA's names and meanings where
// they carry over). It parses and documents them; it must not act on them.
package params

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Prefix starts every parameter's environment variable.
const Prefix = "VMAXDP_"

// DefaultApplicationID matches only the rules file's "*" blocks.
const DefaultApplicationID = "VMAXDP_DEFAULT_APPLICATION_ID"

// Params are the parsed parameters.
type Params struct {
	TraceLevel        int
	LogDetails        int
	LogFile           string
	ConfigFile        string
	ApplicationID     string
	OffloadedSockets  bool
	Spec              string
	RxPoll            int // PollAuto, -1 for ever, or a count
	RxUDPPollOSRatio  int
	SelectPoll        int // PollAuto, -1 for ever, or microseconds
	SelectPollOSRatio int
	SelectSkipOS      int
	RxBytesMin        int
	RxBufs            int
	ProgressInterval  int // milliseconds
	ProgressMax       int
	TxKickDelay       int // microseconds
	FirstSendWait     int // milliseconds
	MTU               int
	Interface         string
	XDPMode           string
	Backend           string
	StatsFile         string
	StatsFDNum        int
	StatsDir          string
	CPUUsageStats     bool
	TxMCLoopback      bool
	TCP               bool
	PeerNotify        bool
	SysmonBatch       bool
}

// Param describes one parameter.
type Param struct {
	Name    string // without Prefix
	Title   string // as the start-up banner prints it
	Default string
	Help    string
	set     func(p *Params, v string) error
	get     func(p *Params) string
}

// Trace levels, VMA's meanings.
const (
	LevelPanic = iota
	LevelError
	LevelWarning
	LevelInfo
	LevelDebug
	LevelFunc
	LevelFuncAll
)

// LevelNames name the trace levels as log lines print them.
var LevelNames = [...]string{"PANIC", "ERROR", "WARNING", "INFO", "DEBUG", "FUNC", "FUNC_ALL"}

func intParam(name, title, def, help string, lo, hi int, f func(*Params) *int) Param {
	return Param{Name: name, Title: title, Default: def, Help: help,
		set: func(p *Params, v string) error {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return fmt.Errorf("%q is not an integer", v)
			}
			if n < lo || n > hi {
				return fmt.Errorf("%d is out of range %d..%d", n, lo, hi)
			}
			*f(p) = n
			return nil
		},
		get: func(p *Params) string { return strconv.Itoa(*f(p)) }}
}

func boolParam(name, title, def, help string, f func(*Params) *bool) Param {
	return Param{Name: name, Title: title, Default: def, Help: help,
		set: func(p *Params, v string) error {
			switch strings.TrimSpace(v) {
			case "0":
				*f(p) = false
			case "1":
				*f(p) = true
			default:
				return fmt.Errorf("%q: want 0 or 1", v)
			}
			return nil
		},
		get: func(p *Params) string {
			if *f(p) {
				return "1"
			}
			return "0"
		}}
}

func stringParam(name, title, def, help string, check func(string) error, f func(*Params) *string) Param {
	return Param{Name: name, Title: title, Default: def, Help: help,
		set: func(p *Params, v string) error {
			if check != nil {
				if err := check(v); err != nil {
					return err
				}
			}
			*f(p) = v
			return nil
		},
		get: func(p *Params) string { return *f(p) }}
}

// All lists every parameter, in banner order.
var All = []Param{
	intParam("TRACELEVEL", "Log Level", "3", "Log verbosity: 0 PANIC, 1 ERROR, 2 WARNING, 3 INFO (start-up banner, sockets not offloaded), 4 DEBUG (every socket call), 5 FUNC, 6 FUNC_ALL.", 0, 6, func(p *Params) *int { return &p.TraceLevel }),
	intParam("LOG_DETAILS", "Log Details", "0", "Details on each log line: 0 none, 1 thread id, 2 pid and thread id, 3 time (ms since start), pid and thread id.", 0, 3, func(p *Params) *int { return &p.LogDetails }),
	stringParam("LOG_FILE", "Log File", "", "Write the log to this file instead of stderr; a single %d becomes the pid.", checkLogFile, func(p *Params) *string { return &p.LogFile }),
	stringParam("CONFIG_FILE", "Conf File", "/etc/libvmaxdp.conf", "Rules file in libvma.conf syntax choosing which sockets are offloaded; a missing default file means offload everything.", nil, func(p *Params) *string { return &p.ConfigFile }),
	stringParam("APPLICATION_ID", "Application ID", DefaultApplicationID, "Which application-id blocks of the rules file apply, besides those whose id is *.", nil, func(p *Params) *string { return &p.ApplicationID }),
	boolParam("OFFLOADED_SOCKETS", "Offloaded Sockets", "1", "1: sockets are offloaded unless a rule says os; 0: only sockets a rule says vmaxdp for.", func(p *Params) *bool { return &p.OffloadedSockets }),
	stringParam("SPEC", "Spec", "", "A profile of parameters, as VMA_SPEC: latency (every wait polls for ever: VMAXDP_RX_POLL=-1 and VMAXDP_SELECT_POLL=-1, for a core per polling thread; VMAXDP_SYSMON_BATCH=1; and VMAXDP_FIRST_SEND_WAIT=1000). Parameters set explicitly win over the profile.", checkSpec, func(p *Params) *string { return &p.Spec }),
	pollParam("RX_POLL", "Rx Poll Loops", "Polls of the AF_XDP queues before a blocking receive sleeps: auto (poll while polling pays: see package stack's Spin), -1 forever, 0 sleep at once, N that many polls (VMA's meaning).", func(p *Params) *int { return &p.RxPoll }),
	intParam("RX_UDP_POLL_OS_RATIO", "Rx UDP Poll OS Ratio", "100", "While polling, look at the kernel socket once every this many polls (0: only before sleeping).", 0, 100000000, func(p *Params) *int { return &p.RxUDPPollOSRatio }),
	pollParam("SELECT_POLL", "Select Poll (usec)", "Microseconds select, poll and epoll_wait poll the queues before they block: auto (poll while polling pays), -1 forever, 0 block at once, N that many microseconds (VMA's meaning).", func(p *Params) *int { return &p.SelectPoll }),
	intParam("SELECT_SKIP_OS", "Select Skip OS", "4", "select, poll and epoll_wait look at kernel fds on entry only once every this many calls when an offloaded socket is ready (0: every call).", 0, 10000, func(p *Params) *int { return &p.SelectSkipOS }),
	intParam("SELECT_POLL_OS_RATIO", "Select Poll OS Ratio", "10", "While select, poll or epoll_wait polls, look at kernel fds once every this many polls (0: only before blocking).", 0, 100000000, func(p *Params) *int { return &p.SelectPollOSRatio }),
	intParam("RX_BYTES_MIN", "Rx Byte Min Limit", "65536", "Least payload bytes an offloaded socket queues, whatever SO_RCVBUF says; datagrams beyond the limit are dropped and counted.", 1, 1<<30, func(p *Params) *int { return &p.RxBytesMin }),
	intParam("RX_BUFS", "Rx Mem Bufs", "4096", "UMEM frames per AF_XDP queue, a power of two: half wait in the fill ring, the rest serve transmit and datagrams not yet read.", 64, 1<<20, func(p *Params) *int { return &p.RxBufs }),
	intParam("PROGRESS_ENGINE_INTERVAL", "Progress Engine Interval (msec)", "10", "When no receive has polled the AF_XDP queues for this many milliseconds, an engine thread drains them into the sockets' queues, and watches them while nobody polls, so that an unread socket's datagrams wait there instead of starving the fill ring (0: never).", 0, 100000, func(p *Params) *int { return &p.ProgressInterval }),
	intParam("PROGRESS_ENGINE_WCE_MAX", "Progress Engine WCE Max", "2048", "Most frames one drain of the progress engine takes.", 1, 1<<20, func(p *Params) *int { return &p.ProgressMax }),
	intParam("TX_KICK_DELAY", "Tx Kick Delay (usec)", "20", "Microseconds a send may leave its datagram on the AF_XDP TX ring without the system call that sends it, so that consecutive sends share one: the call comes when a batch of 32 is full, when the application next receives or waits (recv, poll, select, epoll_wait), or when this delay is over (0: a system call per send).", 0, 1000000, func(p *Params) *int { return &p.TxKickDelay }),
	intParam("FIRST_SEND_WAIT", "First Send Wait (msec)", "0", "Milliseconds a socket's first send waits for its interface's stack while it opens (the first socket on an interface opens it: an XDP program attached, AF_XDP sockets bound, 30-50 ms); the sends before it is open go through the kernel socket, counted in tx_os. 0: no send waits, and a short-lived client (dig, a QUIC client's connection) starts as fast as on the kernel; 1000: every datagram is offloaded from the first, as under VMA. The latency profile sets 1000.", 0, 10000, func(p *Params) *int { return &p.FirstSendWait }),
	intParam("MTU", "MTU", "0", "Largest IP datagram the engine sends itself (0: the interface's MTU); larger ones go through the kernel, which fragments them.", 0, 9000, func(p *Params) *int { return &p.MTU }),
	stringParam("INTERFACE", "Interface", "", "Interface serving sockets bound to 0.0.0.0 (default: the only up interface with an IPv4 address other than lo, else the one the default route leaves by).", nil, func(p *Params) *string { return &p.Interface }),
	stringParam("XDP_MODE", "XDP Mode", "auto", "auto (native, else generic), native or generic.", checkXDPMode, func(p *Params) *string { return &p.XDPMode }),
	stringParam("BACKEND", "Backend", "auto", "auto (RDMA verbs where a device with raw packet QPs backs the interface, else AF_XDP; the log says why), xdp or verbs. The verbs datapath is not built yet: verbs stops vmaxdp run with what is missing.", checkBackend, func(p *Params) *string { return &p.Backend }),
	stringParam("STATS_FILE", "Stats File", "", "At close, write each socket's counters to this file (at an end without a close, such as a signal, the helper writes the last published ones).", nil, func(p *Params) *string { return &p.StatsFile }),
	intParam("STATS_FD_NUM", "Stats FD Num (max)", "0", "Most sockets whose counters are published (0: all).", 0, 1<<20, func(p *Params) *int { return &p.StatsFDNum }),
	stringParam("STATS_DIR", "Stats Dir", "/dev/shm", "Directory of the shared-memory counters that vmaxdp stats reads.", nil, func(p *Params) *string { return &p.StatsDir }),
	boolParam("TCP", "TCP Offload", "0", "1: TCP listeners are offloaded as UDP sockets are (the rules' tcp_server role), their connections served by gVisor's netstack; 0: TCP stays on the kernel. Off by default: netstack's request-response round trip is slower than the kernel's here (README).", func(p *Params) *bool { return &p.TCP }),
	boolParam("PEER_NOTIFY", "Peer Notification", "1", "1: a helper process (vmaxdp notify-peers) outlives the process: if it ends without closing its sockets (SIGKILL, a crash, _exit, exec), the helper sends what its last sends left on the AF_XDP TX rings for a coalesced kick, and tells the peers of its offloaded TCP connections, as the kernel's close of a dying process's sockets does: each peer gets a reset; 0: no helper, such datagrams are lost and such a peer waits for data that never comes. VMA's vmad.", func(p *Params) *bool { return &p.PeerNotify }),
	boolParam("TX_MC_LOOPBACK", "Tx MC Loopback", "1", "Initial IP_MULTICAST_LOOP of every UDP socket (the application's setsockopt overrides it). While it is on, multicast to a group that has a member on this host (on the sending interface) goes through the kernel, which gives the member its copy, and the rest is offloaded; 0 offloads it all.", func(p *Params) *bool { return &p.TxMCLoopback }),
	boolParam("SYSMON_BATCH", "Go Sysmon Batch", "0", "1: Go's sysmon thread inside the application runs SCHED_BATCH, so that its wake-ups (hundreds a second while threads poll) no longer preempt a polling thread: sockperf ping-pong's p99 with the client under vmaxdp went from 13.5 to 5.8 us, the kernel's 5.5 (README); its work waits for a scheduler tick on a busy CPU, which cost unbound with two threads 5-15% of its queries a second. The latency profile sets it.", func(p *Params) *bool { return &p.SysmonBatch }),
	boolParam("CPU_USAGE_STATS", "Polling CPU idle usage", "0", "1: measure the CPU share spent polling in select, poll and epoll_wait.", func(p *Params) *bool { return &p.CPUUsageStats }),
}

// PollAuto is the value of RxPoll and SelectPoll at "auto": waits poll
// while polling pays (stack.Spin) instead of a fixed count or time.
const PollAuto = -2

// pollParam is RX_POLL or SELECT_POLL: "auto" (the default) or VMA's
// integer, -1 for ever.
func pollParam(name, title, help string, f func(*Params) *int) Param {
	ip := intParam(name, title, "auto", help, -1, 100000000, f)
	return Param{Name: name, Title: title, Default: "auto", Help: help,
		set: func(p *Params, v string) error {
			if strings.TrimSpace(v) == "auto" {
				*f(p) = PollAuto
				return nil
			}
			return ip.set(p, v)
		},
		get: func(p *Params) string {
			if *f(p) == PollAuto {
				return "auto"
			}
			return ip.get(p)
		}}
}

func checkSpec(v string) error {
	switch v {
	case "", "latency":
		return nil
	}
	return fmt.Errorf("%q: want latency, or empty", v)
}

func checkLogFile(v string) error {
	if strings.Count(v, "%") > 1 || strings.Contains(v, "%") && !strings.Contains(v, "%d") {
		return errors.New("only a single %d may appear")
	}
	return nil
}

func checkXDPMode(v string) error {
	switch v {
	case "auto", "native", "generic":
		return nil
	}
	return fmt.Errorf("%q: want auto, native or generic", v)
}

func checkBackend(v string) error {
	switch v {
	case "auto", "xdp", "verbs":
		return nil
	}
	return fmt.Errorf("%q: want auto, xdp or verbs", v)
}

// Defaults returns the parameters at their defaults.
func Defaults() *Params {
	p := &Params{}
	for _, d := range All {
		if err := d.set(p, d.Default); err != nil {
			panic("params: default of " + d.Name + ": " + err.Error())
		}
	}
	return p
}

// Load reads the parameters from lookup (os.LookupEnv in a process). Every
// bad value is reported, naming the variable.
func Load(lookup func(string) (string, bool)) (*Params, error) {
	p := Defaults()
	var errs []error
	set := map[string]bool{}
	for _, d := range All {
		if v, ok := lookup(Prefix + d.Name); ok {
			set[d.Name] = true
			if err := d.set(p, v); err != nil {
				errs = append(errs, fmt.Errorf("%s%s: %w", Prefix, d.Name, err))
			}
		}
	}
	if p.Spec == "latency" {
		if !set["RX_POLL"] {
			p.RxPoll = -1
		}
		if !set["SELECT_POLL"] {
			p.SelectPoll = -1
		}
		if !set["SYSMON_BATCH"] {
			p.SysmonBatch = true
		}
		if !set["FIRST_SEND_WAIT"] {
			p.FirstSendWait = 1000
		}
	}
	return p, errors.Join(errs...)
}

// Value is a parameter's current value as text.
func (p *Params) Value(d Param) string { return d.get(p) }

// LogPath is LogFile with its %d replaced by pid.
func (p *Params) LogPath(pid int) string {
	return strings.Replace(p.LogFile, "%d", strconv.Itoa(pid), 1)
}

// WriteBanner writes the start-up banner: the trace level and log file
// always, every other parameter only when it differs from its default, as
// VMA's does.
func (p *Params) WriteBanner(w io.Writer, prefix string) {
	for _, d := range All {
		v := d.get(p)
		if v == d.Default && d.Name != "TRACELEVEL" && d.Name != "LOG_FILE" {
			continue
		}
		fmt.Fprintf(w, "%s%-30s %-10s [%s%s]\n", prefix, d.Title, v, Prefix, d.Name)
	}
}

// WriteDoc lists every parameter with its default and meaning (`vmaxdp params`).
func WriteDoc(w io.Writer) {
	for _, d := range All {
		def := d.Default
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(w, "%s%s (default %s)\n    %s\n", Prefix, d.Name, def, d.Help)
	}
}

// FromEnv loads the process's parameters.
func FromEnv() (*Params, error) { return Load(os.LookupEnv) }

// StatsDir is the stats directory a reader of the counters files uses
// (vmaxdp stats, nettrace record): dir when set, else $VMAXDP_STATS_DIR,
// else the default.
func StatsDir(dir string) string {
	if dir != "" {
		return dir
	}
	if d := os.Getenv(Prefix + "STATS_DIR"); d != "" {
		return d
	}
	return Defaults().StatsDir
}
