"""tcpsemantics: TCP client calls whose outcome the kernel defines, each
printed as "NAME: RESULT" (the result, or the errno's name), for
TestRunTCPSemantics, which runs it on the kernel and under vmaxdp
(VMAXDP_TCP=1) and compares what they print.

    python3 tcpsemantics.py ADDR PORT CLOSED_PORT

ADDR:PORT echoes what each connection sends, and closes the connection
when it reads "close-now"; nothing listens on ADDR:CLOSED_PORT.
"""
import errno
import fcntl
import select
import socket
import struct
import sys
import termios
import time

from say import say


A = (sys.argv[1], int(sys.argv[2]))
CLOSED = (sys.argv[1], int(sys.argv[3]))
out = []
def note(name, f):
    try: out.append(f"{name}: {f()}")
    except OSError as e: out.append(f"{name}: {errno.errorcode.get(e.errno, e.errno)}")
c = socket.create_connection(A)
note("peername", lambda: c.getpeername())
note("sockname", lambda: (c.getsockname()[0], c.getsockname()[1] != 0))
note("echo", lambda: (c.sendall(b"hello"), c.recv(100))[1])
def peek():
    c.sendall(b"peekaboo"); time.sleep(0.2)
    return c.recv(4, socket.MSG_PEEK), c.recv(100)
note("MSG_PEEK", peek)
def waitall():
    c.sendall(b"a" * 3000); return len(c.recv(3000, socket.MSG_WAITALL))
note("MSG_WAITALL", waitall)
def fionread():
    c.sendall(b"x" * 77); time.sleep(0.2)
    n = struct.unpack("i", fcntl.ioctl(c, termios.FIONREAD, b"\0\0\0\0"))[0]; c.recv(100); return n
note("FIONREAD", fionread)
note("TCP_NODELAY default", lambda: c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
note("TCP_NODELAY set", lambda: (c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1), c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))[1])
note("SO_ERROR", lambda: c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
note("SO_TYPE", lambda: c.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE))
note("TCP_INFO state", lambda: c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)[0])
note("dontwait empty", lambda: c.recv(100, socket.MSG_DONTWAIT))
def shutwr():
    c.sendall(b"last"); c.shutdown(socket.SHUT_WR)
    r = []
    while True:
        d = c.recv(100)
        r.append(d)
        if not d: break
    return r
note("SHUT_WR then read to EOF", shutwr)
note("send after SHUT_WR", lambda: c.send(b"x"))
c.close()
def refused():
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(CLOSED)
    except OSError as e:
        out.append(f"connect refused: {errno.errorcode.get(e.errno, e.errno)}")
    note("getpeername after", lambda: s.getpeername())


refused()
def nonblock():
    s = socket.socket(); s.setblocking(False)
    r = s.connect_ex(A)
    select.select([], [s], [], 2)
    return errno.errorcode.get(r, r), s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
note("nonblocking connect", nonblock)
def peerclose():
    s = socket.create_connection(A, timeout=2); s.sendall(b"close-now"); time.sleep(0.3)
    r = [s.recv(100)]
    try:
        s.send(b"x"); time.sleep(0.3); s.send(b"y"); r.append("sent")
    except OSError as e:
        r.append(errno.errorcode.get(e.errno))
    return r
note("peer closes", peerclose)
def linger0():
    s = socket.create_connection(A, timeout=2)
    s.sendall(b"hi")
    s.recv(10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    return "closed"


note("SO_LINGER 0 close", linger0)
say("\n".join(out))
