"""dualstack: a UDP echo server on one AF_INET6 socket that carries IPv4
as well (IPV6_V6ONLY off, bound to ::), for TestRunDualStack.

    python3 dualstack.py PORT SECONDS

It prints "ready", then for the first datagram of each family the source
address as recvfrom gave it ("from mapped ('::ffff:...', port, 0, 0)",
"from ipv6 ('fe80::...', port, 0, scope)"), echoes every datagram to its
source, and exits after SECONDS.
"""
import socket
import sys
import time

s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", int(sys.argv[1])))
s.settimeout(0.2)
print("ready", flush=True)
seen = set()
end = time.time() + float(sys.argv[2])
while time.time() < end:
    try:
        data, src = s.recvfrom(65536)
    except socket.timeout:
        continue
    family = "mapped" if src[0].startswith("::ffff:") else "ipv6"
    if family not in seen:
        seen.add(family)
        print("from", family, src, flush=True)
    s.sendto(data, src)
