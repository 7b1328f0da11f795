"""gso: a sender that cuts its sends with UDP_SEGMENT (UDP GSO), as QUIC
servers do, for TestRunUDPSegment.

    python3 gso.py ADDR PORT

From one socket it sends to ADDR:PORT, send j's byte x being
(j * 7 + x) % 251:
  0. 64 bytes;
  1-3. with UDP_SEGMENT at 100 on the socket, 400 bytes each: 4 x 100;
  4. 250 bytes with a UDP_SEGMENT message of 150: 150 and 100;
  5. 300 bytes with a UDP_SEGMENT message of 0: 300 whole;
  6. with UDP_SEGMENT back at 0, 400 bytes: whole;
  7. 250 bytes with a UDP_SEGMENT message of 100: 100, 100 and 50.
It prints "sent" when done.
"""
import socket
import struct
import sys

from say import say


SOL_UDP, UDP_SEGMENT = 17, 103

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
to = (sys.argv[1], int(sys.argv[2]))
sends = 0


def payload(n):
    global sends
    b = bytes((sends * 7 + x) % 251 for x in range(n))
    sends += 1
    return b


def segmented(n, size):
    s.sendmsg([payload(n)], [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))], 0, to)


s.sendto(payload(64), to)
s.setsockopt(SOL_UDP, UDP_SEGMENT, 100)
for _ in range(3):
    s.sendto(payload(400), to)
segmented(250, 150)
segmented(300, 0)
s.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
s.sendto(payload(400), to)
segmented(250, 100)
say("sent")
