"""udpsemantics: UDP socket calls whose outcome the kernel defines, each
printed as "NAME: RESULT" (the result, or the errno's name), for
TestRunUDPSemantics, which runs it on the kernel and under vmaxdp and
compares what they print.

    python3 udpsemantics.py ADDR PORT

ADDR:PORT echoes every datagram to its source, and one that begins with
"meta " with the TOS, TTL and DF bit it arrived with.
"""
import ctypes
import errno
import fcntl
import hashlib
import os
import socket
import struct
import sys
import termios
import time

from say import say


A = (sys.argv[1], int(sys.argv[2]))
SOL_UDP, UDP_CORK = 17, 1
out = []


def note(name, f):
    try:
        out.append(f"{name}: {f()}")
    except OSError as e:
        out.append(f"{name}: {errno.errorcode.get(e.errno, e.errno)}")


def later(sock):
    """The datagrams that came back, up to two, the second within 0.2 s."""
    r = [sock.recv(100)]
    sock.settimeout(0.2)
    try:
        r.append(sock.recv(100))
    except OSError:
        pass
    sock.settimeout(2)
    return r


s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
note("empty datagram", lambda: (s.sendto(b"", A), len(s.recv(100)))[1])
note("autobound", lambda: (s.getsockname()[0], s.getsockname()[1] != 0))
note("largest datagram", lambda: (s.sendto(b"m" * 65507, A), len(s.recv(70000)))[1])
note("one byte more", lambda: s.sendto(b"m" * 65508, A))
note("short buffer", lambda: (s.sendto(b"s" * 100, A), len(s.recv(10)))[1])


def trunc():
    s.sendto(b"t" * 100, A)
    time.sleep(0.2)
    return s.recv_into(bytearray(10), 10, socket.MSG_TRUNC)


note("MSG_TRUNC", trunc)


def peek():
    s.sendto(b"peek", A)
    time.sleep(0.2)
    return s.recv(100, socket.MSG_PEEK), s.recv(100)


note("MSG_PEEK", peek)


def fionread():
    s.sendto(b"f" * 33, A)
    time.sleep(0.2)
    n = struct.unpack("i", fcntl.ioctl(s, termios.FIONREAD, b"\0\0\0\0"))[0]
    s.recv(100)
    return n


note("FIONREAD", fionread)
def dontwait():
    n = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    n.bind(("0.0.0.0", 0))
    return n.recv(100, socket.MSG_DONTWAIT)


note("MSG_DONTWAIT, nothing queued", dontwait)


def more():
    s.sendto(b"a", socket.MSG_MORE, A)
    s.sendto(b"b", A)
    time.sleep(0.2)
    return later(s)


note("MSG_MORE", more)


def cork():
    s.setsockopt(SOL_UDP, UDP_CORK, 1)
    s.sendto(b"c1", A)
    s.sendto(b"c2", A)
    s.setsockopt(SOL_UDP, UDP_CORK, 0)
    time.sleep(0.2)
    return later(s)


note("UDP_CORK", cork)
note("after the cork", lambda: (s.sendto(b"d", A), later(s))[1])

c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.settimeout(2)
c.connect(A)
note("connected", lambda: (c.send(b"hi"), c.recv(100))[1])


def disconnect():
    sa = struct.pack("HH12x", socket.AF_UNSPEC, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.connect(c.fileno(), sa, len(sa))


note("connect AF_UNSPEC", disconnect)
note("send, disconnected", lambda: c.send(b"x"))
note("sendto, disconnected", lambda: (c.sendto(b"y", A), c.recv(100))[1])


def shut_wr():
    d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    d.connect(A)
    d.shutdown(socket.SHUT_WR)
    return d.send(b"z")


note("send after SHUT_WR", shut_wr)
m = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
m.settimeout(2)
m.sendto(b"meta plain", A)
m.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x10)
m.sendto(b"meta IP_TOS", A)
m.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 7)
m.sendto(b"meta IP_TTL", A)
m.sendmsg([b"meta cmsg IP_TOS"], [(socket.IPPROTO_IP, socket.IP_TOS, bytes([0x28]))], 0, A)
m.sendto(b"meta after the cmsg", A)
IP_MTU_DISCOVER = 10
for mode, name in ((0, "DONT"), (5, "OMIT"), (1, "WANT")):
    m.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, mode)
    m.sendto(b"meta IP_PMTUDISC_" + name.encode(), A)
for _ in range(8):
    note("sent", lambda: m.recv(100).decode())


def stamps():
    """The ancillary data of a datagram on a socket that asked for
    SO_TIMESTAMPNS, SO_TIMESTAMPING's software receive stamps and
    IP_PKTINFO: the kinds in the kernel's order, and whether each stamp
    is of the last 5 s (SO_TIMESTAMPING's: its first of three, the others
    zero)."""
    SOL_SOCKET, SO_TIMESTAMPNS, SO_TIMESTAMPING, IP_PKTINFO = 1, 35, 37, 8
    ts = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ts.settimeout(2)
    ts.setsockopt(SOL_SOCKET, SO_TIMESTAMPNS, 1)
    ts.setsockopt(SOL_SOCKET, SO_TIMESTAMPING, 0x8 | 0x10)  # RX_SOFTWARE | SOFTWARE
    ts.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
    ts.sendto(b"stamped", A)
    _, anc, _, _ = ts.recvmsg(100, 256)
    got = []
    for level, typ, data in anc:
        fresh = ""
        if (level, typ) in ((SOL_SOCKET, SO_TIMESTAMPNS), (SOL_SOCKET, SO_TIMESTAMPING)):
            v = struct.unpack("qq" * (len(data) // 16), data)
            fresh = " fresh" if abs(v[0] + v[1] / 1e9 - time.time()) < 5 and not any(v[2:]) else " stale"
        got.append(f"{level}/{typ}/{len(data)}{fresh}")
    return " ".join(got)


note("receive stamps", stamps)


def scattered():
    """A datagram read into two buffers, then one too long for both."""
    a, b = bytearray(5), bytearray(10)
    s.sendto(b"0123456789ab", A)
    n, _, flags, _ = s.recvmsg_into([a, b])
    first = f"{n} {bytes(a)!r} {bytes(b[:n - 5])!r} truncated {bool(flags & socket.MSG_TRUNC)}"
    s.sendto(b"x" * 20, A)
    n, _, flags, _ = s.recvmsg_into([a, b])
    return f"{first}; {n} truncated {bool(flags & socket.MSG_TRUNC)}"


note("scattered", scattered)


def gathered(pieces, sock=None, connected=False):
    """A datagram sent as pieces (sendmsg's iovecs, or writev's on a
    connected socket): its length and digest as the echo had it."""
    if connected:
        d = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        d.settimeout(2)
        d.connect(A)
        n = os.writev(d.fileno(), pieces)
    else:
        d = s
        n = d.sendmsg(pieces, [], 0, A)
    back = d.recv(70000)
    return f"sent {n}, back {len(back)} {hashlib.sha1(back).hexdigest()[:12]}"


def pieces(sizes):
    return [bytes([i + 65]) * n for i, n in enumerate(sizes)]


note("gathered, 3 pieces", lambda: gathered(pieces([1, 0, 40])))
note("gathered, 40 pieces", lambda: gathered(pieces([i % 7 for i in range(40)])))
note("gathered, too long for a frame", lambda: gathered(pieces([1000, 2000, 1000])))
note("gathered, 20 pieces too long for a frame", lambda: gathered(pieces([200] * 20)))
note("writev", lambda: gathered(pieces([3, 5, 0, 9]), connected=True))

SIOCGSTAMP, SIOCGSTAMPNS = 0x8906, 0x8907
g = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
g.settimeout(2)


def stamp_of(req):
    """SIOCGSTAMP (a timeval) or SIOCGSTAMPNS (a timespec), in seconds."""
    v = struct.unpack("qq", fcntl.ioctl(g.fileno(), req, bytes(16)))
    return v[0] + v[1] / (1e9 if req == SIOCGSTAMPNS else 1e6)


def first_stamp():
    """After the first datagram read, with stamps off until this call:
    the time of the call, which a second call gives again."""
    g.sendto(b"first", A)
    g.recv(100)
    a = stamp_of(SIOCGSTAMP)
    time.sleep(0.05)
    b = stamp_of(SIOCGSTAMP)
    return f"{'fresh' if abs(a - time.time()) < 5 else 'stale'}, {'kept' if abs(a - b) < 1e-6 else 'not kept'}"


def later_stamp():
    """After a datagram read 0.3 s after it came: its arrival."""
    g.sendto(b"later", A)
    time.sleep(0.3)
    g.recv(100)
    read = time.time()
    age = read - stamp_of(SIOCGSTAMPNS)
    return "its arrival, before the read" if 0.2 < age < 5 else f"not its arrival ({age:.3f} s before the read)"


note("SIOCGSTAMP before any datagram", lambda: stamp_of(SIOCGSTAMP))
note("SIOCGSTAMP after one read", first_stamp)
note("SIOCGSTAMPNS after a later read", later_stamp)
say("\n".join(out))
