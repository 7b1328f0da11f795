"""say: what the Python test programs print with, a line in one write.

vmaxdp's log shares their output, and Python writes each part of a print
apart (the text, the separators, the newline) when unbuffered
(PYTHONUNBUFFERED): a log line landed inside a printed one, and a test
that looked for the line failed.
"""
import sys


def say(*parts):
    """print(*parts), in one write."""
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()
