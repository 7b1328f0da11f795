"""bindtodevice: a UDP receiver bound to an interface with
SO_BINDTODEVICE, for TestRunBindToDevice.

    python3 bindtodevice.py DEV PORT before|after|tcp

before: it binds the device, then 0.0.0.0:PORT, prints "ready" and waits
1.5 s for a datagram: "got DATA" or "timeout".
after: it binds 0.0.0.0:PORT, prints "ready", waits 5 s for a datagram
("got DATA" or "timeout"), then binds the device, prints "moved" and waits
1.5 s for another.
tcp: a TCP listener on 0.0.0.0:PORT bound to the device prints "ready"
and waits 3 s for a connection: "accepted" or "timeout".
tcp-after: a TCP listener on 0.0.0.0:PORT prints "ready", waits 5 s for
a connection ("accepted" or "timeout"), then binds the device, prints
"moved" and waits 1.5 s for another.
"""
import socket
import sys

from say import say


dev, port, when = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def wait(sock, seconds, call):
    """Says what call returns, or "timeout" after seconds on sock."""
    sock.settimeout(seconds)
    try:
        say(*call())
    except socket.timeout:
        say("timeout")


if when in ("tcp", "tcp-after"):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if when == "tcp":
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
    ls.bind(("0.0.0.0", port))
    ls.listen()
    say("ready")

    def accept():
        ls.accept()
        return ["accepted"]

    if when == "tcp-after":
        wait(ls, 5, accept)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
        say("moved")
        wait(ls, 1.5, accept)
    else:
        wait(ls, 3, accept)
    sys.exit(0)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def recv():
    return ["got", s.recv(100).decode()]


if when == "before":
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
s.bind(("0.0.0.0", port))
say("ready")
if when == "after":
    wait(s, 5, recv)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
    say("moved")
wait(s, 1.5, recv)
