"""broadcast: sends to a subnet's broadcast address and to
255.255.255.255, without SO_BROADCAST and then with it, and to a unicast
address, for TestRunBroadcastSend.

    python3 broadcast.py BCAST UNICAST PORT

It prints a line a send: "DST ok" or "DST errno NAME".
"""
import errno
import socket
import sys

from say import say


bcast, unicast, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def send(dst, what):
    try:
        s.sendto(what.encode(), (dst, port))
        say(dst, "ok")
    except OSError as e:
        say(dst, "errno", errno.errorcode.get(e.errno, e.errno))


send(unicast, "unicast")
send(bcast, "directed")
send("255.255.255.255", "limited")
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
send(bcast, "directed-allowed")
send("255.255.255.255", "limited-allowed")
