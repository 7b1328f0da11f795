"""gso: a sender that sets UDP_SEGMENT (UDP GSO) on its socket, for
TestRunUDPSegment.

    python3 gso.py ADDR PORT

From one socket it sends to ADDR:PORT: a 64-byte datagram; with
UDP_SEGMENT at 100, three sends of 400 bytes, each of which the kernel
cuts into four datagrams of 100; with UDP_SEGMENT back at 0, one of 400.
It prints "sent" when done.
"""
import socket
import sys

from say import say


SOL_UDP, UDP_SEGMENT = 17, 103

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
to = (sys.argv[1], int(sys.argv[2]))
s.sendto(b"a" * 64, to)
s.setsockopt(SOL_UDP, UDP_SEGMENT, 100)
for _ in range(3):
    s.sendto(b"b" * 400, to)
s.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
s.sendto(b"c" * 400, to)
say("sent")
