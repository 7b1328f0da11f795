// Package backend defines the narrow interface through which the user-space
// stack reaches a packet queue, so that stack/ knows nothing of AF_XDP rings
// or verbs queue pairs.
//
// A Backend lends frames: Receive hands out frames that stay valid until
// Release gives them back, and Alloc hands out transmit frames that belong
// to the backend again once passed to Transmit. A Backend is not safe for
// concurrent use: its owner (one stack queue) serialises calls, but for
// Flush and Unsent, which may run beside the others (a kick's system call
// need not hold up the next sender). Nothing in this package may allocate
// per packet.
package backend

import "errors"

// ErrNotSupported is returned when the kernel or device lacks a feature a
// backend needs.
var ErrNotSupported = errors.New("not supported")

// ErrBusy is Flush's when the device stayed busy through the kick: frames
// stay queued (Unsent) for a later one.
var ErrBusy = errors.New("device busy: frames stay queued")

// Buf is one frame lent by a backend. Data starts at the Ethernet header.
// For transmit, Alloc sets Data to the frame's full capacity and the caller
// reslices it to the frame's length before Transmit.
type Buf struct {
	Data []byte
	// ID is the backend's handle of the frame; callers pass it back untouched.
	ID uint64
	// CsumStart and CsumOffset ask Transmit to complete a transport
	// checksum, as the kernel's CHECKSUM_PARTIAL does: the 16-bit field at
	// CsumStart+CsumOffset holds the folded pseudo-header sum, and the
	// checksum covers Data[CsumStart:]. Zero CsumStart: the frame is
	// complete. Only for a backend whose TxChecksum reports true; Alloc
	// clears both.
	CsumStart, CsumOffset uint16
}

// ArrivalStamper is a Backend whose received frames can carry the time
// they arrived, taken before the frame reached the queue (the steering
// program's XDP metadata): a receive timestamp that the wake-up of the
// thread taking the frame off the queue does not delay.
type ArrivalStamper interface {
	// Arrival is the CLOCK_MONOTONIC nanoseconds at which b, a frame
	// Receive handed out and not yet released, arrived; ok is false when
	// it carries none.
	Arrival(b Buf) (monoNs int64, ok bool)
}

// RxWaiter is a Backend that can say how many received frames wait for
// Receive, so that a caller that took a full batch knows whether the queue
// is close to running out of frames to receive into.
type RxWaiter interface {
	RxWaiting() int
}

// Backend is one receive/transmit queue of one interface.
type Backend interface {
	// Receive fills bufs with up to len(bufs) received frames and returns
	// how many; it never blocks.
	Receive(bufs []Buf) int
	// Release returns received frames to the backend.
	Release(bufs []Buf)
	// Alloc fills bufs with up to len(bufs) free transmit frames.
	Alloc(bufs []Buf) int
	// Transmit queues the frames for sending and owns them afterwards; it
	// returns how many were queued (the rest still belong to the caller).
	// A device that stays busy may keep some queued: Unsent says so.
	Transmit(bufs []Buf) (int, error)
	// TransmitLater queues the frames as Transmit does, but may leave
	// them for a later Transmit or Flush to send.
	TransmitLater(bufs []Buf) (int, error)
	// Enqueue queues the frames as Transmit does, for the Flush its
	// caller makes next, once it has let go of the lock that serialises
	// the other calls.
	Enqueue(bufs []Buf) (int, error)
	// Flush sends what Enqueue, TransmitLater or a busy device left;
	// ErrBusy when the device stays busy. It may run beside the other
	// calls, one Flush at a time.
	Flush() error
	// Unsent reports whether queued frames still wait for a Transmit or
	// Flush: TransmitLater or Enqueue left them, or the device stayed busy.
	// It may run beside the other calls.
	Unsent() bool
	// TxChecksum reports whether Transmit completes checksums that
	// Buf.CsumStart asks for.
	TxChecksum() bool
	// FD is a file descriptor that polls readable when Receive has work, for
	// callers that block in poll(2) together with other descriptors.
	FD() int
	// String names the queue in errors and logs ("veth0/q0").
	String() string
	Close() error
}
