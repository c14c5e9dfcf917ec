"""Driving the two-host lab from host 1: programs on host 2, and the link.

:class:`Fabric` runs programs on host 2 through its agent
(:mod:`aiordma.lab.agent`), changes the link between the hosts (cut and
restored, timed outages, ``tc netem`` loss, delay, reordering, duplication;
MTU), reads both hosts' link counters (what crossed), and asks the lab
to crash host 2 (kill its QEMU) or boot it again. It is
what the ``fabric`` test fixture hands out; a command run with
``aiordma lab --hosts 2`` finds everything it needs in its environment
(:meth:`Fabric.from_environment`).

Every wait polls the shared control directory (the two guests share no
notification mechanism); bound it with ``asyncio.timeout()``.

From a shell on host 1, ``python -m aiordma.lab.remote CMD [ARG...]`` runs
CMD on host 2 (in the same directory), shows its output as it comes and
exits with its status.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiordma.exceptions import LabError
from aiordma.lab.agent import POLL_INTERVAL, write_atomically
from aiordma.lab.crossing import LinkBytes, card_files, parse_card


async def poll_until(check: Callable[[], bool]) -> None:
    """Poll ``check()`` until it is true (for state on the shared filesystem)."""
    # Files another machine writes on a shared filesystem: nothing can be
    # awaited, so this polls (every 50 ms; callers bound it with a timeout).
    while not check():  # noqa: ASYNC110
        await asyncio.sleep(POLL_INTERVAL)


def _timed_outage(cut: Sequence[str], restore: Sequence[str], seconds: float) -> float:
    """Apply ``cut``, wait ``seconds``, apply ``restore`` (all on this
    thread); returns the seconds from the cut written to the restore written."""
    tc = subprocess.Popen(
        ["tc", "-batch", "-"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert tc.stdin is not None
    lines = "".join(f"{line}\n" for line in cut).encode()
    tc.stdin.write(lines)
    tc.stdin.flush()
    started = time.monotonic()
    try:
        time.sleep(seconds)
    finally:  # the link comes back whatever happens
        tc.stdin.write("".join(f"{line}\n" for line in restore).encode())
        tc.stdin.flush()
        lasted = time.monotonic() - started
        _, err = tc.communicate()
    if tc.returncode != 0:
        raise LabError(f"tc -batch failed on host 1: {err.decode().strip()}")
    return lasted


def _tc_batch(commands: Sequence[str]) -> str:
    """A shell command running ``commands`` in one ``tc -batch``."""
    return f"printf '%s\\n' {shlex.join(commands)} | tc -batch -"


class PeerProcess:
    """A program running on host 2."""

    def __init__(self, jobs: Path, job_id: str, argv: Sequence[str]) -> None:
        self._jobs = jobs
        self.id = job_id
        self.argv = list(argv)

    def __repr__(self) -> str:
        return f"<PeerProcess {self.id} {' '.join(self.argv)!r}>"

    @property
    def returncode(self) -> int | None:
        """Its exit status (negative: the signal that killed it), None while it runs."""
        try:
            return int((self._jobs / f"{self.id}.rc").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def output(self) -> str:
        """Everything it wrote to stdout and stderr so far."""
        try:
            return (self._jobs / f"{self.id}.out").read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return ""

    async def wait(self) -> int:
        """Wait for it to exit; returns its exit status."""
        await poll_until(lambda: self.returncode is not None)
        rc = self.returncode
        assert rc is not None
        return rc

    async def wait_for_output(self, text: str) -> str:
        """Wait until its output contains ``text``; returns the output.

        Raises :class:`LabError` (with the output) if it exits first.
        """

        def seen() -> bool:
            if text in self.output():
                return True
            if self.returncode is not None:
                raise LabError(
                    f"{self!r} exited with {self.returncode} before printing {text!r}:\n"
                    f"{self.output()}"
                )
            return False

        await poll_until(seen)
        return self.output()

    def send_signal(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to its process group (through the agent)."""
        write_atomically(self._jobs / f"{self.id}.kill", str(int(signum)))

    async def stop(self, grace: float = 10.0) -> int:
        """Terminate it (SIGTERM, then SIGKILL after ``grace`` seconds) and
        wait; returns its exit status."""
        if self.returncode is None:
            self.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    return await self.wait()
            except TimeoutError:
                self.send_signal(signal.SIGKILL)
        return await self.wait()


@dataclass
class Fabric:
    """The two-host lab as seen from host 1."""

    control: Path
    addr: str
    addr6: str
    peer_addr: str
    peer_addr6: str
    nic: str
    _impairment: str | None = None
    _ids = itertools.count(1)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Fabric | None:
        """The fabric this process runs in (None: not on host 1 of a two-host lab)."""
        env = os.environ if env is None else env
        if env.get("AIORDMA_HOSTS") != "2" or env.get("AIORDMA_HOST") != "1":
            return None
        return cls(
            control=Path(env["AIORDMA_FABRIC"]),
            addr=env["AIORDMA_ADDR"],
            addr6=env["AIORDMA_ADDR6"],
            peer_addr=env["AIORDMA_PEER_ADDR"],
            peer_addr6=env["AIORDMA_PEER_ADDR6"],
            nic=env.get("AIORDMA_NIC", ""),
        )

    @property
    def _jobs(self) -> Path:
        return self.control / "jobs"

    def peer_info(self) -> dict[str, str]:
        """What host 2's agent reported when it came up ({} while it is down)."""
        try:
            info: dict[str, str] = json.loads((self.control / "host2.ready").read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return info

    async def wait_for_peer(self) -> None:
        """Wait until host 2's agent serves requests."""
        await poll_until(lambda: bool(self.peer_info()))

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> PeerProcess:
        """Start ``argv`` on host 2 (in ``cwd``, by default this process's)."""
        job_id = f"{os.getpid()}-{next(self._ids)}"
        spec = {"argv": list(argv), "env": dict(env or {}), "cwd": cwd or os.getcwd()}
        write_atomically(self._jobs / f"{job_id}.json", json.dumps(spec))
        return PeerProcess(self._jobs, job_id, argv)

    async def run(self, argv: Sequence[str]) -> tuple[int, str]:
        """Run ``argv`` on host 2 to completion: its exit status and output
        (cancelling the wait stops the program)."""
        proc = self.start(argv)
        try:
            rc = await proc.wait()
        except BaseException:
            proc.send_signal(signal.SIGKILL)
            raise
        return rc, proc.output()

    async def run_both(self, argv: Sequence[str]) -> None:
        """Run a set-up command on both hosts; raise LabError if it fails on either."""
        await self._here(argv)
        await self._there(argv)

    async def _there(self, argv: Sequence[str]) -> None:
        """Run ``argv`` on host 2 to completion (LabError if it fails)."""
        rc, out = await self.run(argv)
        if rc != 0:
            raise LabError(f"{' '.join(argv)} failed on host 2: {out.strip()}")

    @staticmethod
    async def _here(argv: Sequence[str]) -> str:
        """Run ``argv`` on host 1; its output (LabError if it fails)."""
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise LabError(f"{' '.join(argv)} failed on host 1: {err.decode().strip()}")
        return out.decode()

    def _nic(self) -> str:
        # Each host names its card itself (the same name on both: same QEMU
        # machine), reported by the guest init and the agent.
        nic = self.nic or self.peer_info().get("nic") or ""
        if not nic:
            raise LabError("the lab did not report the name of the link's network card")
        return nic

    async def netem(self, spec: str | None) -> None:
        """Impair the link both ways with ``tc netem`` (e.g. ``"loss 1%"``,
        ``"delay 5ms"``); None removes the impairment."""
        await self.run_both(["sh", "-c", self._root_qdisc(spec)])
        self._impairment = spec

    def _root_qdisc(self, spec: str | None) -> str:
        nic = self._nic()
        if spec is None:
            return f"tc qdisc del dev {nic} root 2>/dev/null || true"
        return f"tc qdisc replace dev {nic} root netem {spec}"

    def _cut_lines(self) -> tuple[list[str], list[str]]:
        # Frames are dropped where nothing tells their sender: host 1's
        # incoming ones at ingress, its outgoing ones by netem (a qdisc or
        # filter that refuses a frame reports it, and rxe would then keep
        # resending locally instead of counting transport retries).
        nic = self._nic()
        cut = [
            f"qdisc add dev {nic} clsact",
            f"filter add dev {nic} ingress matchall action drop",
            f"qdisc replace dev {nic} root netem loss 100%",
        ]
        restore = [f"qdisc del dev {nic} clsact"]
        if self._impairment is None:
            restore.append(f"qdisc del dev {nic} root")
        else:
            restore.append(f"qdisc replace dev {nic} root netem {self._impairment}")
        return cut, restore

    async def link(self, up: bool) -> None:
        """Cut the link, or restore it.

        Host 1 silently drops every frame it sends or receives on the link,
        as a pulled cable or a dead switch would; both cards stay up (an
        interface taken down by its administrator is another fault: rxe then
        fails every work request at once). A :meth:`netem` impairment comes
        back with the link.
        """
        cut, restore = self._cut_lines()
        await self._here(["sh", "-c", _tc_batch(restore if up else cut)])

    async def outage(self, seconds: float) -> float:
        """Cut the link for ``seconds``; returns how long it was cut, as
        measured on host 1.

        One ``tc`` process, started beforehand, applies the cut and the
        restore as each is written to it: starting a process takes a good
        part of a second in an emulated guest, longer than the transport's
        retries last. A thread times the cut, so a busy event loop (the
        traffic the outage is meant to interrupt) cannot stretch it.
        """
        cut, restore = self._cut_lines()
        return await asyncio.to_thread(_timed_outage, cut, restore, seconds)

    async def link_bytes(self) -> LinkBytes:
        """Both hosts' link cards' byte counters now (see :mod:`aiordma.lab.crossing`)."""
        files = card_files(self._nic())
        here = parse_card(await self._here(["cat", *files]))
        rc, out = await self.run(["cat", *files])
        if rc != 0:
            raise LabError(f"host 2's link counters could not be read: {out.strip()}")
        return LinkBytes(host1=here, host2=parse_card(out))

    async def set_mtu(self, mtu: int, *, host: int = 2) -> None:
        """Set the MTU of ``host``'s card on the link (rxe follows it)."""
        argv = ["ip", "link", "set", self._nic(), "mtu", str(mtu)]
        await (self._here(argv) if host == 1 else self._there(argv))

    async def _request(self, action: str) -> None:
        requests = self.control / "control"
        request_id = f"{os.getpid()}-{next(self._ids)}"
        write_atomically(requests / f"{request_id}.json", json.dumps({"action": action}))
        await poll_until((requests / f"{request_id}.done").exists)

    async def crash_peer(self) -> None:
        """Kill host 2's QEMU at once: no disconnect, no reset, as a power cut."""
        await self._request("crash")

    async def boot_peer(self) -> None:
        """Boot host 2 again (after :meth:`crash_peer`) and wait for its agent."""
        await self._request("boot")
        await self.wait_for_peer()


async def _run_on_peer(argv: Sequence[str]) -> int:
    fabric = Fabric.from_environment()
    if fabric is None:
        raise SystemExit(
            "python -m aiordma.lab.remote runs a command on host 2 of the two-host lab, "
            "from host 1: aiordma lab --hosts 2 -- ... python -m aiordma.lab.remote CMD"
        )
    proc = fabric.start(argv)
    shown = 0
    try:
        while True:
            rc = proc.returncode  # read before the output: nothing written after it is missed
            out = proc.output()
            print(out[shown:], end="", flush=True)
            shown = len(out)
            if rc is not None:
                return rc
            await asyncio.sleep(POLL_INTERVAL)
    except BaseException:
        proc.send_signal(signal.SIGKILL)
        raise


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m aiordma.lab.remote CMD [ARG...]")
    raise SystemExit(asyncio.run(_run_on_peer(sys.argv[1:])))
