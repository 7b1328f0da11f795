"""dualstack: an echo server on one AF_INET6 socket that carries IPv4 as
well (IPV6_V6ONLY off, bound to ::), for TestRunDualStack.

    python3 dualstack.py udp|tcp PORT SECONDS
    python3 dualstack.py client udp|tcp ADDR PORT N
    python3 dualstack.py forking PORT SECONDS

It prints "ready", then for the first datagram or connection of each
family what the socket calls said of it: "from mapped (...)" or
"from ipv6 (...)" with the source as recvfrom or accept gave it, and for
TCP the accepted socket's family, SO_DOMAIN, getsockname and getpeername.
It echoes everything to its source, and exits after SECONDS.

As a client, it sends N messages from an unbound AF_INET6 socket to the
IPv4 address ADDR, mapped, each to be echoed within 2 s, and prints
"echoed K of N"; over TCP, one connection, and first its family,
SO_DOMAIN, getsockname and getpeername.

Forking, it is a socketserver.ForkingTCPServer on the same kind of socket,
whose child answers each connection's line with the line and its
getpeername.

    python3 dualstack.py group GROUP IFADDR PORT N SECONDS

As a group member, the socket joins the IPv4 GROUP on the interface of
IFADDR with IP_ADD_MEMBERSHIP, as a dual-stack socket may, prints
"ready", and prints "got K of N from SOURCE" once N datagrams came, or
SECONDS passed.
"""
import socket
import sys
import threading
import time

from say import say


if sys.argv[1] == "client":
    udp = sys.argv[2] == "udp"
    c = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    c.settimeout(2)
    dst, n, echoed = ("::ffff:" + sys.argv[3], int(sys.argv[4])), int(sys.argv[5]), 0
    if not udp:
        c.connect(dst)
        say("connected", int(c.family), c.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN), c.getsockname()[0], c.getpeername())
    for i in range(n):
        msg = b"message %d;" % i
        try:
            if udp:
                c.sendto(msg, dst)
                data, src = c.recvfrom(65536)
                echoed += data == msg and src[:2] == dst
            else:
                c.sendall(msg)
                data = b""
                while len(data) < len(msg):
                    data += c.recv(len(msg) - len(data))
                echoed += data == msg
        except socket.timeout:
            continue
    say("echoed", echoed, "of", n)
    sys.exit(0)

if sys.argv[1] == "group":
    group, ifaddr, port, n, seconds = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    g = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    g.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    g.bind(("::", port))
    g.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(group) + socket.inet_aton(ifaddr))
    g.settimeout(0.2)
    say("ready")
    got, src, end = 0, None, time.time() + seconds
    while got < n and time.time() < end:
        try:
            _, src = g.recvfrom(65536)
            got += 1
        except socket.timeout:
            pass
    say("got", got, "of", n, "from", src and src[0])
    sys.exit(0)

if sys.argv[1] == "forking":
    import socketserver

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            line = self.rfile.readline().strip()
            self.wfile.write(b"%s %r\n" % (line, self.request.getpeername()))

    class Server(socketserver.ForkingTCPServer):
        address_family = socket.AF_INET6
        allow_reuse_address = True

        def server_bind(self):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()

    server = Server(("::", int(sys.argv[2])), Handler)
    say("ready")
    threading.Timer(float(sys.argv[3]), server.shutdown).start()
    server.serve_forever()
    sys.exit(0)

proto, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", port))
if proto == "tcp":
    s.listen(16)
s.settimeout(0.2)
say("ready")
seen = set()


def first(src, *more):
    family = "mapped" if src[0].startswith("::ffff:") else "ipv6"
    if family not in seen:
        seen.add(family)
        say("from", family, src, *more)


def serve(c, src):
    first(src, int(c.family), c.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN), c.getsockname(), c.getpeername())
    while True:
        data = c.recv(65536)
        if not data:
            break
        c.sendall(data)
    c.close()


end = time.time() + seconds
while time.time() < end:
    try:
        if proto == "udp":
            data, src = s.recvfrom(65536)
        else:
            c, src = s.accept()
    except socket.timeout:
        continue
    if proto == "udp":
        first(src)
        s.sendto(data, src)
    else:
        c.settimeout(None)
        threading.Thread(target=serve, args=(c, src), daemon=True).start()
