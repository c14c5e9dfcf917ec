"""The two-host lab's agent: runs on host 2 and runs what host 1 asks.

Both guests see the host's filesystem, so they talk through a control
directory both may write (the lab's management path; the RDMA link between
the guests carries nothing of it, so cutting or degrading that link never
cuts the control). Host 1 (see :mod:`aiordma.lab.remote`) drops a job file,
the agent starts it and writes its output and exit status next to it:

``jobs/ID.json``
    the request: ``{"argv": [...], "env": {...}, "cwd": "..."}``, written
    under another name and renamed into place so it is never read half-written;
``jobs/ID.out``
    the job's stdout and stderr, as they come;
``jobs/ID.rc``
    its exit status (negative: killed by that signal), once it exited;
``jobs/ID.kill``
    a request to send the job's process group the signal named inside.

The agent writes ``host2.ready`` when it starts serving (and
``host2.forks`` once its fork server, below, has imported), and exits (killing
what still runs) when ``stop`` appears. Run as
``python -m aiordma.lab.agent CONTROL_DIR [PRELOAD...]``: with PRELOAD
modules, a Python job (``python -m MODULE``, ``-c CODE`` or a script) is a
fork of a server that imported them once (:mod:`aiordma.lab.forkserver`),
not a fresh interpreter that imports them again (seconds in a guest).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aiordma.exceptions import LabError
from aiordma.lab.forkserver import ForkedPopen, ForkServer

POLL_INTERVAL = 0.05
"""Seconds between looks at the control directory (it is a shared
filesystem between two machines: there is no change notification)."""


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` under another name and rename it into place, so the
    other machine never reads it half-written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.rename(path)


class Agent:
    """Serve job requests from ``control`` until ``control/stop`` appears."""

    def __init__(self, control: Path, preload: Sequence[str] = ()) -> None:
        self.control = control
        self.jobs = control / "jobs"
        self.jobs.mkdir(parents=True, exist_ok=True)
        self.running: dict[str, subprocess.Popen[bytes] | ForkedPopen] = {}
        self.preload = tuple(preload)
        self.forks: ForkServer | None = None
        self.forks_ready = False

    def serve(self) -> None:
        ready = {
            "pid": os.getpid(),
            "nic": os.environ.get("AIORDMA_NIC"),
            "addr": os.environ.get("AIORDMA_ADDR"),
            "addr6": os.environ.get("AIORDMA_ADDR6"),
        }
        if self.preload:  # importing while jobs that come first start afresh
            self.forks = ForkServer.start(self.preload, wait=False)
        write_atomically(self.control / "host2.ready", json.dumps(ready))
        try:
            while not (self.control / "stop").exists():
                self._watch_forks()
                self._start_new()
                self._deliver_kills()
                self._reap()
                time.sleep(POLL_INTERVAL)
        finally:
            for job_id, proc in self.running.items():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                write_atomically(self.jobs / f"{job_id}.rc", str(proc.returncode))
            if self.forks is not None:
                self.forks.close()

    def _start_new(self) -> None:
        for request in sorted(self.jobs.glob("*.json")):
            job_id = request.stem
            try:
                spec = json.loads(request.read_text())
                argv = [str(a) for a in spec["argv"]]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                (self.jobs / f"{job_id}.out").write_text(f"aiordma lab agent: bad request: {exc}\n")
                write_atomically(self.jobs / f"{job_id}.rc", "127")
                request.unlink()
                continue
            request.rename(request.with_suffix(".taken"))
            env = os.environ | {str(k): str(v) for k, v in spec.get("env", {}).items()}
            cwd = spec.get("cwd") or None
            with open(self.jobs / f"{job_id}.out", "wb") as out:
                try:
                    self.running[job_id] = self._fork(argv, cwd, env, out.fileno()) or (
                        subprocess.Popen(
                            argv,
                            cwd=cwd,
                            env=env,
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
                except OSError as exc:
                    out.write(f"aiordma lab agent: cannot start {argv[0]}: {exc}\n".encode())
                    write_atomically(self.jobs / f"{job_id}.rc", "127")

    def _watch_forks(self) -> None:
        """Note when the fork server has imported its modules (``host2.forks``)."""
        if self.forks is None or self.forks_ready:
            return
        try:
            self.forks_ready = self.forks.is_ready()
        except LabError as exc:  # its preloads failed: every job starts afresh
            print(f"aiordma lab agent: no fork server: {exc}", file=sys.stderr, flush=True)
            self.forks = None
            return
        if self.forks_ready:
            write_atomically(self.control / "host2.forks", " ".join(self.preload))

    def _fork(
        self, argv: list[str], cwd: str | None, env: dict[str, str], out: int
    ) -> ForkedPopen | None:
        """``python ARGS`` as a fork of the preloaded server, if it can be one."""
        if self.forks is None or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
            return None
        if not self.forks_ready or not self.forks.can_run(argv[1:], env):
            return None
        try:
            return self.forks.popen(
                *argv[1:], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        except LabError:
            return None

    def _deliver_kills(self) -> None:
        for request in self.jobs.glob("*.kill"):
            proc = self.running.get(request.stem)
            try:
                signum = int(request.read_text().strip() or signal.SIGTERM)
            except (OSError, ValueError):
                signum = signal.SIGTERM
            request.unlink()
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signum)

    def _reap(self) -> None:
        for job_id, proc in list(self.running.items()):
            if proc.poll() is not None:
                del self.running[job_id]
                write_atomically(self.jobs / f"{job_id}.rc", str(proc.returncode))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m aiordma.lab.agent CONTROL_DIR [PRELOAD...]", file=sys.stderr)
        return 2
    Agent(Path(args[0]), args[1:]).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
