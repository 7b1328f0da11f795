package engine

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
)

// Log writes VMA-style log lines ("vmaxdp WARNING: ...") at or below the
// configured trace level, with VMAXDP_LOG_DETAILS' prefixes.
type Log struct {
	mu      sync.Mutex
	w       io.Writer
	level   int
	details int
	start   time.Time
	pid     int
}

func newLog(p *params.Params, stderr io.Writer) (*Log, error) {
	l := &Log{w: stderr, level: p.TraceLevel, details: p.LogDetails, start: time.Now(), pid: os.Getpid()}
	if l.level >= params.LevelDebug && l.details == 0 {
		l.details = 2 // VMA's default at DEBUG and above
	}
	if p.LogFile != "" {
		path := p.LogPath(l.pid)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return l, fmt.Errorf("%sLOG_FILE %s: %w", params.Prefix, path, err)
		}
		l.w = f
	}
	return l, nil
}

// Enabled says whether lines of level are written.
func (l *Log) Enabled(level int) bool { return level <= l.level }

// Printf writes one line at level.
func (l *Log) Printf(level int, format string, args ...any) {
	if level > l.level {
		return
	}
	var prefix string
	switch l.details {
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
