package stats

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
)

// The file is a fixed header and the payload. The writer publishes with a
// sequence lock: it makes seq odd, writes the payload and its length, and
// makes seq even again; a reader that sees the same even seq before and
// after copying has a consistent snapshot. The control words are the
// readers': they ask the process to zero its counters, change its log
// level or dump a socket, and the process acknowledges.
//
//	off  size  writer's
//	  0     8  magic "VMXSTATS"
//	  8     4  format version
//	 12     4  header size
//	 16     8  layout hash (see codec.go)
//	 24     4  pid
//	 32     8  process start time, clock ticks after boot (/proc/PID/stat)
//	 40     8  seq
//	 48     8  payload length
//	 56     8  last zero request handled
//	          readers'
//	 64     8  zero request (incremented)
//	 72     4  log level asked + 1 (0: none)
//	 76     4  log details asked + 1 (0: none)
//	 80     8  fd dump request (incremented)
//	 88     4  fd to dump (0: all)
//	 92     4  log level of the dump
const (
	magic         = "VMXSTATS"
	FormatVersion = 1
	headerSize    = 128

	offVersion   = 8
	offHdrSize   = 12
	offLayout    = 16
	offPID       = 24
	offStart     = 32
	offSeq       = 40
	offLen       = 48
	offZeroAck   = 56
	offZeroReq   = 64
	offLogLevel  = 72
	offLogDetail = 76
	offDumpReq   = 80
	offDumpFD    = 88
	offDumpLevel = 92
)

// FileName is the name of pid's stats file in the stats directory.
func FileName(pid int) string { return "vmaxdp." + strconv.Itoa(pid) + ".stats" }

// ParseFileName reads the pid out of a FileName.
func ParseFileName(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "vmaxdp.")
	if !ok {
		return 0, false
	}
	if s, ok = strings.CutSuffix(s, ".stats"); !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(s)
	return pid, err == nil && pid > 0
}

// StartTicks is pid's start time in clock ticks after boot, field 22 of
// /proc/PID/stat: with the pid, it names one process across pid reuse.
func StartTicks(pid int) (uint64, error) {
	// One read into a buffer on the stack: every preloaded process makes
	// this call as it starts, and os.ReadFile (an fstat, a second read, a
	// growing buffer) was about half of its stats file's creation (perf).
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var buf [1024]byte // a stat line is 300-400 bytes; its comm at most 64
	n, err := unix.Read(fd, buf[:])
	unix.Close(fd)
	if err != nil {
		return 0, &os.PathError{Op: "read", Path: path, Err: err}
	}
	b := buf[:n]
	// The command name (field 2) may hold spaces and parentheses: count
	// fields after its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// OpenHigh opens a file for a process that runs an application: at the top
// of its fd space (package highfd), so that the application's own fds keep
// the numbers they would have without vmaxdp, and outside Go's poller,
// which would take two more fds of its own (epoll, eventfd).
func OpenHigh(path string, flag int, perm uint32) (*os.File, error) {
	fd, err := unix.Open(path, flag|unix.O_CLOEXEC, perm)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(highfd.Move(fd)), path), nil
}

// CloseHigh closes a file OpenHigh opened.
func CloseHigh(f *os.File) error {
	highfd.Forget(int(f.Fd()))
	return f.Close()
}

// Control is what readers asked of the process.
type Control struct {
	ZeroRequest uint64
	LogLevel    int // -1: not asked
	LogDetails  int // -1: not asked
	DumpRequest uint64
	DumpFD      int
	DumpLevel   int
}

// Writer publishes one process's snapshots.
type Writer struct {
	f    *os.File
	dir  *os.File // the file's directory, through which Close removes it: a process may chroot meanwhile
	path string
	seq  uint64
	buf  []byte
	word [8]byte
}

// Create makes pid's stats file in dir, mode 0600. A file left by an
// earlier process with the same pid is replaced.
func Create(dir string, pid int) (*Writer, error) {
	start, err := StartTicks(pid)
	if err != nil {
		return nil, fmt.Errorf("stats: start time of pid %d: %w", pid, err)
	}
	path := filepath.Join(dir, FileName(pid))
	os.Remove(path)
	d, err := OpenHigh(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	f, err := OpenHigh(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		CloseHigh(d)
		return nil, fmt.Errorf("stats: %w", err)
	}
	h := make([]byte, headerSize)
	copy(h, magic)
	binary.LittleEndian.PutUint32(h[offVersion:], FormatVersion)
	binary.LittleEndian.PutUint32(h[offHdrSize:], headerSize)
	binary.LittleEndian.PutUint64(h[offLayout:], layoutHash)
	binary.LittleEndian.PutUint32(h[offPID:], uint32(pid))
	binary.LittleEndian.PutUint64(h[offStart:], start)
	if _, err := f.WriteAt(h, 0); err != nil {
		CloseHigh(f)
		CloseHigh(d)
		os.Remove(path)
		return nil, fmt.Errorf("stats: %s: %w", path, err)
	}
	return &Writer{f: f, dir: d, path: path, buf: make([]byte, headerSize, 64<<10)}, nil
}

// Path is the file's path.
func (w *Writer) Path() string { return w.path }

// File is the open file, for a process that hands it to another (the
// peer-notification helper reads the last snapshot of a process that
// died).
func (w *Writer) File() *os.File { return w.f }

func (w *Writer) putWord(off int, v uint64) error {
	binary.LittleEndian.PutUint64(w.word[:], v)
	_, err := w.f.WriteAt(w.word[:], int64(off))
	return err
}

// Publish writes s. It is not safe for concurrent use.
func (w *Writer) Publish(s *Snapshot) error {
	w.buf = Encode(w.buf[:headerSize], s)
	w.seq++ // odd: readers retry
	if err := w.putWord(offSeq, w.seq); err != nil {
		return fmt.Errorf("stats: %s: %w", w.path, err)
	}
	payload := w.buf[headerSize:]
	if _, err := w.f.WriteAt(payload, headerSize); err != nil {
		return fmt.Errorf("stats: %s: %w", w.path, err)
	}
	if err := w.putWord(offLen, uint64(len(payload))); err != nil {
		return fmt.Errorf("stats: %s: %w", w.path, err)
	}
	w.seq++
	if err := w.putWord(offSeq, w.seq); err != nil {
		return fmt.Errorf("stats: %s: %w", w.path, err)
	}
	return nil
}

// Control reads what readers asked.
func (w *Writer) Control() (Control, error) {
	var b [32]byte
	if _, err := w.f.ReadAt(b[:], offZeroReq); err != nil {
		return Control{}, fmt.Errorf("stats: %s: %w", w.path, err)
	}
	return Control{
		ZeroRequest: binary.LittleEndian.Uint64(b[0:]),
		LogLevel:    int(int32(binary.LittleEndian.Uint32(b[8:]))) - 1,
		LogDetails:  int(int32(binary.LittleEndian.Uint32(b[12:]))) - 1,
		DumpRequest: binary.LittleEndian.Uint64(b[16:]),
		DumpFD:      int(int32(binary.LittleEndian.Uint32(b[24:]))),
		DumpLevel:   int(int32(binary.LittleEndian.Uint32(b[28:]))),
	}, nil
}

// AckZero tells readers that zero request n is done.
func (w *Writer) AckZero(n uint64) error {
	if err := w.putWord(offZeroAck, n); err != nil {
		return fmt.Errorf("stats: %s: %w", w.path, err)
	}
	return nil
}

// Chown gives the file to uid: a process that gives up root must still
// remove it at exit (in /dev/shm, a sticky directory, only its owner may).
func (w *Writer) Chown(uid int) error {
	if err := w.f.Chown(uid, -1); err != nil {
		return fmt.Errorf("stats: %s: %w", w.path, err)
	}
	return nil
}

// Close removes the file.
func (w *Writer) Close() error {
	err := unix.Unlinkat(int(w.dir.Fd()), filepath.Base(w.path), 0)
	if err != nil {
		err = &os.PathError{Op: "remove", Path: w.path, Err: err}
	}
	return errors.Join(CloseHigh(w.f), CloseHigh(w.dir), err)
}

// Reader reads one process's stats file.
type Reader struct {
	f     *os.File
	Path  string
	PID   int
	start uint64
	buf   []byte
}

// Open opens a stats file and checks its header. Opening needs write
// access only for the requests (zero, log level, dump); a read-only open
// is tried when read-write is refused.
func Open(path string) (*Reader, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrPermission) {
		f, err = os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	r := &Reader{f: f, Path: path}
	h := make([]byte, headerSize)
	n, err := f.ReadAt(h, 0)
	if err != nil && n < 40 {
		f.Close()
		return nil, fmt.Errorf("stats: %s: %w: %d-byte header", path, ErrFormat, n)
	}
	switch {
	case string(h[:8]) != magic:
		err = fmt.Errorf("stats: %s: %w: bad magic %q", path, ErrFormat, h[:8])
	case binary.LittleEndian.Uint32(h[offVersion:]) != FormatVersion:
		err = fmt.Errorf("stats: %s: %w: format version %d, this vmaxdp reads version %d", path, ErrFormat, binary.LittleEndian.Uint32(h[offVersion:]), FormatVersion)
	case binary.LittleEndian.Uint32(h[offHdrSize:]) != headerSize || n < headerSize:
		err = fmt.Errorf("stats: %s: %w: header of %d bytes", path, ErrFormat, binary.LittleEndian.Uint32(h[offHdrSize:]))
	case binary.LittleEndian.Uint64(h[offLayout:]) != layoutHash:
		err = fmt.Errorf("stats: %s: %w: written by a vmaxdp build with another counter layout; read it with that build's vmaxdp stats", path, ErrFormat)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	r.PID = int(binary.LittleEndian.Uint32(h[offPID:]))
	r.start = binary.LittleEndian.Uint64(h[offStart:])
	return r, nil
}

// Alive says whether the process that wrote the file still runs.
func (r *Reader) Alive() bool {
	t, err := StartTicks(r.PID)
	return err == nil && t == r.start
}

func (r *Reader) word(off int64) (uint64, error) {
	var b [8]byte
	if _, err := r.f.ReadAt(b[:], off); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// ErrBusy: the writer kept publishing while the reader tried to copy a
// consistent snapshot.
var ErrBusy = errors.New("stats file changed during every read attempt")

// Read copies the latest snapshot into s. A file whose process has not
// published yet reads as ErrNotPublished.
func (r *Reader) Read(s *Snapshot) error {
	for try := 0; try < 100; try++ {
		seq, err := r.word(offSeq)
		if err != nil {
			return fmt.Errorf("stats: %s: %w", r.Path, err)
		}
		if seq == 0 {
			return fmt.Errorf("stats: %s: %w", r.Path, ErrNotPublished)
		}
		if seq&1 == 1 {
			time.Sleep(time.Millisecond)
			continue
		}
		n, err := r.word(offLen)
		if err != nil {
			return fmt.Errorf("stats: %s: %w", r.Path, err)
		}
		if n > 1<<30 {
			return fmt.Errorf("stats: %s: %w: payload length %d", r.Path, ErrCorrupt, n)
		}
		if cap(r.buf) < int(n) {
			r.buf = make([]byte, n)
		}
		r.buf = r.buf[:n]
		if _, err := r.f.ReadAt(r.buf, headerSize); err != nil {
			return fmt.Errorf("stats: %s: payload: %w", r.Path, err)
		}
		if again, err := r.word(offSeq); err != nil || again != seq {
			continue
		}
		if err := Decode(r.buf, s); err != nil {
			return fmt.Errorf("stats: %s: %w", r.Path, err)
		}
		return nil
	}
	return fmt.Errorf("stats: %s: %w", r.Path, ErrBusy)
}

// ErrNotPublished: the process has not published its first snapshot.
var ErrNotPublished = errors.New("no snapshot published yet")

func (r *Reader) putWord(off int64, v uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	if _, err := r.f.WriteAt(b[:], off); err != nil {
		return fmt.Errorf("stats: %s: request: %w", r.Path, err)
	}
	return nil
}

func (r *Reader) putInt32s(off int64, a, b int) error {
	var w [8]byte
	binary.LittleEndian.PutUint32(w[0:], uint32(int32(a)))
	binary.LittleEndian.PutUint32(w[4:], uint32(int32(b)))
	if _, err := r.f.WriteAt(w[:], off); err != nil {
		return fmt.Errorf("stats: %s: request: %w", r.Path, err)
	}
	return nil
}

// Zero asks the process to zero its counters and waits (up to timeout)
// until it has.
func (r *Reader) Zero(timeout time.Duration) error {
	req, err := r.word(offZeroReq)
	if err != nil {
		return fmt.Errorf("stats: %s: %w", r.Path, err)
	}
	req++
	if err := r.putWord(offZeroReq, req); err != nil {
		return err
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		if ack, err := r.word(offZeroAck); err == nil && ack >= req {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stats: %s: pid %d did not zero its counters within %v", r.Path, r.PID, timeout)
		}
	}
}

// SetLog asks the process to change its log level and details (-1:
// leave as is).
func (r *Reader) SetLog(level, details int) error {
	var cur [8]byte
	if _, err := r.f.ReadAt(cur[:], offLogLevel); err != nil {
		return fmt.Errorf("stats: %s: %w", r.Path, err)
	}
	l := int(int32(binary.LittleEndian.Uint32(cur[0:])))
	d := int(int32(binary.LittleEndian.Uint32(cur[4:])))
	if level >= 0 {
		l = level + 1
	}
	if details >= 0 {
		d = details + 1
	}
	return r.putInt32s(offLogLevel, l, d)
}

// Dump asks the process to write the counters of fd (0: all its
// sockets) to its log at level.
func (r *Reader) Dump(fd, level int) error {
	req, err := r.word(offDumpReq)
	if err != nil {
		return fmt.Errorf("stats: %s: %w", r.Path, err)
	}
	if err := r.putInt32s(offDumpFD, fd, level); err != nil {
		return err
	}
	return r.putWord(offDumpReq, req+1)
}

// Close closes the file.
func (r *Reader) Close() error { return r.f.Close() }

// Found is one stats file of a directory.
type Found struct {
	Path  string
	PID   int
	Alive bool
	Err   error // the file could not be opened or is of another format
}

// List finds the stats files of dir, sorted by pid.
func List(dir string) ([]Found, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	var out []Found
	for _, e := range ents {
		pid, ok := ParseFileName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		f := Found{Path: filepath.Join(dir, e.Name()), PID: pid}
		if r, err := Open(f.Path); err != nil {
			f.Err = err
			// A file of another format is judged by its name's pid.
			_, serr := os.Stat("/proc/" + strconv.Itoa(pid))
			f.Alive = serr == nil
		} else {
			f.Alive = r.Alive()
			r.Close()
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Found) int { return a.PID - b.PID })
	return out, nil
}
