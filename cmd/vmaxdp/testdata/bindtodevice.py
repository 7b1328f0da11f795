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
if when in ("tcp", "tcp-after"):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if when == "tcp":
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
    ls.bind(("0.0.0.0", port))
    ls.listen()
    say("ready")

    def accept(seconds):
        ls.settimeout(seconds)
        try:
            ls.accept()
            say("accepted")
        except socket.timeout:
            say("timeout")

    if when == "tcp-after":
        accept(5)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
        say("moved")
        accept(1.5)
    else:
        accept(3)
    sys.exit(0)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def wait(seconds):
    s.settimeout(seconds)
    try:
        say("got", s.recv(100).decode())
    except socket.timeout:
        say("timeout")


if when == "before":
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
s.bind(("0.0.0.0", port))
say("ready")
if when == "after":
    wait(5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
    say("moved")
wait(1.5)
