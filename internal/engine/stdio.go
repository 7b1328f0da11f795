package engine

import "golang.org/x/sys/unix"

// Connections handed to code past the interposer. glibc's stdio (printf,
// fputs, fgets on a FILE) reads and writes its descriptor with system
// calls of its own, which no preload library sees: on an offloaded
// connection they would reach its mirror, where a write is lost and a
// read returns the mirror's marks. A shell's `printf ... >&3` on a
// /dev/tcp connection (its builtins write through stdio to fd 1, made a
// copy of fd 3) sent nothing, and the shell waited for an answer for
// ever. A program that execs goes the same way: the new program cannot
// use the netstack of the image it replaces, which ends with it, and
// the peers of the connections it inherited were reset.
//
// So a connection moves to a kernel socket under the same fds (TCP_REPAIR,
// as at fork: connToKernel) when it becomes a standard stream (dup2 onto
// fd 0, 1 or 2), when fdopen gives it to stdio, and before an exec that
// it outlives (no FD_CLOEXEC). Where it cannot move (bytes in flight, an
// epoll set's member, no CAP_NET_ADMIN), it stays, with the reason
// logged.

// atStdio and atExec are ToStdio's and Execing's connMoves.
var (
	atStdio = connMove{
		when:  "as a standard stream",
		other: "the C library's stdio (printf, fgets), whose system calls vmaxdp does not see,",
		cause: "handed to a kernel socket (TCP_REPAIR) as it became a standard stream or stdio's: the C library's stdio reads and writes it with system calls vmaxdp does not see",
		wait:  inFlightWait,
	}
	atExec = connMove{
		when:  "at exec",
		other: "the program exec starts",
		cause: "handed to a kernel socket (TCP_REPAIR) before exec: the program it starts inherits it, and cannot use this one's engine",
		wait:  inFlightWait,
	}
)

// ToStdio moves fd's connection, if it names one, to a kernel socket:
// stdio is to read and write it (fdopen, or a dup onto a standard
// stream).
func (e *Engine) ToStdio(fd int) {
	if t := e.tcpConn(fd); t != nil {
		e.connToKernel(t, e.namedConns()[t], atStdio)
	}
}

// Execing runs before an exec: the connections that outlive it (an fd
// without FD_CLOEXEC) move to kernel sockets.
func (e *Engine) Execing() {
	for t, named := range e.namedConns() {
		for _, fd := range named {
			if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && fl&unix.FD_CLOEXEC == 0 {
				e.connToKernel(t, named, atExec)
				break
			}
		}
	}
}
