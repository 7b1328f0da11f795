package bench

import "golang.org/x/sys/unix"

// errNoBufs: a full transmit queue, which a sender at full speed meets and
// simply retries.
var errNoBufs = unix.ENOBUFS
