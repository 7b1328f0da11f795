"""tcpserver: a TCP server whose every connection does what its first
line asks, for TestRunTCPServerSemantics, which runs it on the kernel and
under vmaxdp (VMAXDP_TCP=1) and compares what a kernel client in side A
sees.

    python3 tcpserver.py PORT N

It listens on 0.0.0.0:PORT, prints "ready", serves N connections one
after the other and exits. Each first line:
  echo        echoes what follows until the client's EOF, then closes;
  names       answers with getsockname and getpeername, then closes;
  close       closes at once;
  linger0     closes with SO_LINGER 0 (a reset);
  unread      closes after the client's next bytes arrive, unread (the
              kernel answers unread data with a reset);
  halfclose   shuts down its sending (the client reads EOF), then echoes
              what the client sends until its EOF.
"""
import socket
import struct
import sys
import time

from say import say


port, n = int(sys.argv[1]), int(sys.argv[2])
ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("0.0.0.0", port))
ls.listen(8)
say("ready")


def line(c):
    b = b""
    while not b.endswith(b"\n"):
        d = c.recv(1)
        if not d:
            break
        b += d
    return b.decode().strip()


def echo(c):
    while True:
        d = c.recv(4096)
        if not d:
            return
        c.sendall(d)


for _ in range(n):
    c, peer = ls.accept()
    cmd = line(c)
    if cmd == "echo":
        echo(c)
    elif cmd == "names":
        me, them = c.getsockname(), c.getpeername()
        c.sendall(f"{me[0]}:{me[1]} {them[0]}\n".encode())
    elif cmd == "linger0":
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    elif cmd == "unread":
        c.sendall(b"go\n")
        time.sleep(0.5)
    elif cmd == "halfclose":
        c.shutdown(socket.SHUT_WR)
        echo_back = c.recv(100)
        c.close()
        say("halfclose got", echo_back.decode())
        continue
    c.close()
    say("served", cmd)
