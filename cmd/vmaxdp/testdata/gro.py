"""gro: a UDP socket with UDP_GRO on (as QUIC servers have it), for
TestRunUDPGRO.

    python3 gro.py ADDR PORT N

It binds ADDR:PORT, turns UDP_GRO on and says "ready"; reads N datagrams
(side A's), then sends itself 1000 bytes with UDP_SEGMENT at 100 from a
second socket (through lo, where the kernel hands them over coalesced)
and reads them. For each read it says the length, the segment size of
its UDP_GRO message (0: none) and the flags.
"""
import socket
import struct
import sys

from say import say


SOL_UDP, UDP_SEGMENT, UDP_GRO = 17, 103, 104

addr = (sys.argv[1], int(sys.argv[2]))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(addr)
s.setsockopt(SOL_UDP, UDP_GRO, 1)
s.settimeout(5)
say("ready")


def read():
    data, anc, flags, _ = s.recvmsg(65536, 256)
    gro = 0
    for level, typ, value in anc:
        if (level, typ) == (SOL_UDP, UDP_GRO):
            gro = struct.unpack("i", value[:4])[0]
    say("got", len(data), "gro", gro, "flags", flags)


for _ in range(int(sys.argv[3])):
    read()
g = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
g.setsockopt(SOL_UDP, UDP_SEGMENT, 100)
g.sendto(b"g" * 1000, addr)
read()
say("done")
