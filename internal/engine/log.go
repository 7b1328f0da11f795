package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stats"
)

// Log writes VMA-style log lines ("vmaxdp WARNING: ...") at or below the
// configured trace level, with VMAXDP_LOG_DETAILS' prefixes.
type Log struct {
	mu      sync.Mutex
	w       io.Writer
	level   atomic.Int32 // vmaxdp stats -l changes it while the process runs
	details atomic.Int32 // vmaxdp stats -D
	start   time.Time
	pid     int
}

func newLog(p *params.Params, stderr io.Writer) (*Log, error) {
	l := &Log{w: stderr, start: time.Now(), pid: os.Getpid()}
	l.level.Store(int32(p.TraceLevel))
	l.details.Store(int32(p.LogDetails))
	if p.TraceLevel >= params.LevelDebug && p.LogDetails == 0 {
		l.details.Store(2) // VMA's default at DEBUG and above
	}
	if p.LogFile != "" {
		path := p.LogPath(l.pid)
		f, err := stats.OpenHigh(path, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o644)
		if err != nil {
			return l, fmt.Errorf("%sLOG_FILE %s: %w", params.Prefix, path, err)
		}
		l.w = f
	}
	return l, nil
}

// Enabled says whether lines of level are written.
func (l *Log) Enabled(level int) bool { return level <= int(l.level.Load()) }

// Level is the trace level.
func (l *Log) Level() int { return int(l.level.Load()) }

// Details is the log details level (VMAXDP_LOG_DETAILS).
func (l *Log) Details() int { return int(l.details.Load()) }

// SetLevel changes the trace level.
func (l *Log) SetLevel(level int) { l.level.Store(int32(level)) }

// SetDetails changes the log details level.
func (l *Log) SetDetails(d int) { l.details.Store(int32(d)) }

// Printf writes one line at level.
func (l *Log) Printf(level int, format string, args ...any) {
	if !l.Enabled(level) {
		return
	}
	var prefix string
	switch l.details.Load() {
	case 1:
		prefix = fmt.Sprintf("Tid: %5d : ", unix.Gettid())
	case 2:
		prefix = fmt.Sprintf("Pid: %5d Tid: %5d : ", l.pid, unix.Gettid())
	case 3:
		prefix = fmt.Sprintf("Time: %9.3f Pid: %5d Tid: %5d : ", float64(time.Since(l.start).Microseconds())/1000, l.pid, unix.Gettid())
	}
	l.mu.Lock()
	fmt.Fprintf(l.w, "vmaxdp %-7s: %s%s\n", params.LevelNames[level], prefix, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

// slogHandler sends the log/slog lines of the packages the engine uses
// (xsk, steer) through the engine's log, so that an application's output
// carries one log format: their Info lines are details (DEBUG), their
// warnings and errors keep their level.
type slogHandler struct {
	l     *Log
	attrs []slog.Attr
}

func slogLevel(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return params.LevelError
	case l >= slog.LevelWarn:
		return params.LevelWarning
	case l >= slog.LevelInfo:
		return params.LevelDebug
	}
	return params.LevelFunc
}

func (h *slogHandler) Enabled(_ context.Context, l slog.Level) bool {
	return h.l.Enabled(slogLevel(l))
}

func (h *slogHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	add := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.l.Printf(slogLevel(r.Level), "%s", b.String())
	return nil
}

func (h *slogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &slogHandler{l: h.l, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h *slogHandler) WithGroup(string) slog.Handler { return h }
