"""A program for the fork server's tests: ``python -m tests.lab.forked_child MODE ARGS``.

``report``: prints its argv, working directory, ``sys.path[0]``, ``__name__``
and ``$FORKED``, one per line, then exits with status 3. ``wait``: prints
``waiting`` and sleeps until killed. ``shutdown``: registers an atexit
handler that prints ``atexit ran`` (the interpreter's shutdown ran).
``family``: prints its pid, session id and parent's pid, then waits as
``wait`` does.
"""

from __future__ import annotations

import atexit
import os
import sys
import time


def main() -> int:
    mode = sys.argv[1]
    if mode == "report":
        print(" ".join(sys.argv[1:]))
        print(os.getcwd())
        print(sys.path[0])
        print(__name__)
        print(os.environ.get("FORKED", "-"))
        print("to stderr", file=sys.stderr)
        return 3
    if mode == "wait":
        print("waiting", flush=True)
        while True:
            time.sleep(60)
    if mode == "family":
        print(os.getpid(), os.getsid(0), os.getppid(), flush=True)
        while True:
            time.sleep(60)
    if mode == "shutdown":
        atexit.register(print, "atexit ran")
        return 0
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    raise SystemExit(main())
