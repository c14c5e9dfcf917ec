"""The floor of an awaited round trip: where a small message's time goes, beside C and TCP.

    aiordma lab -- python -m benchmarks wake_floor [--rounds 1000] [--size 64] [--json]

One boot, one peer process (uvloop), and a ping-pong of ``--size`` bytes
measured by client processes of each kind:

* ``ib_send_lat`` busy polling, and with ``-e`` (waiting on the completion
  channel: the C floor for any design that sleeps until the adapter
  signals);
* a framed TCP ping-pong (:class:`aiordma.bench.tcp.Framed`) on asyncio and
  on uvloop;
* the same over aiordma's verbs (``verbs``: an awaited receive and send on
  a connection, as ``aiordma bench send_lat`` does), and over a
  :class:`~aiordma.MessageChannel` (``aiordma``) on asyncio and on uvloop;
* with ``--ucxx PYTHON``, the kind ``ucxx uvloop``: UCXX's asyncio API in
  its "blocking" progress mode (the worker's descriptor on the loop), one
  tagged send each way with the size known to both ends, against its own
  echo server; ``PYTHON`` is an interpreter that has ``ucxx`` and can import
  aiordma, ``--ucx-lib DIR`` the UCX built with verbs that it should load
  (``scripts/peer-ucxx`` makes both). It is not one of the default kinds.

For each: the median round trip, and per round trip the client's user and
system CPU time and its voluntary context switches (each one a sleep in
``epoll_wait`` or a blocking read: the process's wake-ups), which a Python
client takes around its timed loop (``getrusage``) and perftest's from
two runs, of ``rounds`` and ``5 * rounds``, and their difference; its
system calls (``strace -c``, when strace is installed; by name) and the
packets the device sent (both sides: requests and acknowledgements), from
two runs of ``rounds`` and ``2 * rounds`` (under strace), so start-up is not
counted. The latency comes from a run without strace. With ``--perf DIR``
each Python client's timed loop is also sampled by ``perf record``
(``cpu-clock``), and its CPU is shown by shared object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiordma.bench import perftest, tcp
from aiordma.bench.stats import percentile
from benchmarks import lab_address

T = TypeVar("T")

KINDS = ("ib_send_lat", "ib_send_lat -e", "tcp asyncio", "tcp uvloop",
         "verbs uvloop", "aiordma asyncio", "aiordma uvloop")  # fmt: skip
UCXX = "ucxx uvloop"
"""The peer library's kind, run only when asked for (it needs ``--ucxx``)."""


@dataclass
class Run:
    """One kind's figures, per round trip."""

    p50_us: float
    wakeups: float
    user_us: float
    system_us: float
    machine_us: float
    """CPU time of the whole machine (both vCPUs: client, peer, rxe) per round trip."""
    softirq_us: float
    """The part of ``machine_us`` spent in softirqs."""
    packets: float
    """Packets the device sent per round trip, both directions (requests and
    acknowledgements: client and peer share the device)."""
    syscalls: dict[str, float] = field(default_factory=dict)


def strace_counts(path: str) -> dict[str, int]:
    """System calls by name (and ``total``) from ``strace -c``'s table."""
    counts: dict[str, int] = {}
    with open(path) as table:
        for line in table:
            fields = line.split()
            if len(fields) < 5 or not fields[3].isdigit():
                continue
            try:
                float(fields[0])
            except ValueError:
                continue
            counts[fields[-1]] = int(fields[3])
    return counts


def sent_packets(device: str) -> int:
    """The packets ``device``'s port 1 has sent (rxe's ``hw_counters``), or 0
    where the device does not count them."""
    path = f"/sys/class/infiniband/{device}/ports/1/hw_counters/sent_pkts"
    try:
        with open(path) as counter:
            return int(counter.read())
    except OSError:
        return 0


Usage = tuple[str, tuple[int, float, float], dict[str, int]]
"""A client run's output, its (voluntary context switches, user and system
CPU seconds), and its system calls by name."""


def _popen_usage(argv: list[str], strace: bool) -> Usage:
    """Run ``argv`` (under ``strace -c`` if asked): see :data:`Usage` (the
    resource usage taken by ``wait4``)."""
    fd, trace = tempfile.mkstemp(suffix=".strace")
    os.close(fd)
    if strace:
        argv = ["strace", "-f", "-c", "-o", trace, *argv]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        pid = os.posix_spawnp(argv[0], argv, dict(os.environ),
                              file_actions=[(os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                                            (os.POSIX_SPAWN_DUP2, err.fileno(), 2)])  # fmt: skip
        _, status, usage = os.wait4(pid, 0)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    try:
        if os.waitstatus_to_exitcode(status):
            raise RuntimeError(f"{' '.join(argv[:3])} failed: {stderr.strip()[-400:]}")
        counts = strace_counts(trace) if strace else {}
        return stdout, (usage.ru_nvcsw, usage.ru_utime, usage.ru_stime), counts
    finally:
        os.unlink(trace)


def _client_argv(kind: str, addr: str, port: int, tcp_port: int, rounds: int, size: int,
                 device: str) -> list[str]:  # fmt: skip
    if kind.startswith("ib_send_lat"):
        argv = ["ib_send_lat", "-d", device, "-R", "-F", "-s", str(size), "-n", str(rounds),
                "-p", str(perftest.PORT)]  # fmt: skip
        return [*argv, *(["-e"] if kind.endswith("-e") else []), addr]
    what, loop = kind.split()
    python = UCXX_PYTHON[0] if what == "ucxx" else sys.executable
    port = {"tcp": tcp_port, "ucxx": UCXX_PORT}.get(what, port)
    return [python, "-m", __name__, "--client", what, "--loop", loop, "--addr", addr,
            "--port", str(port), "--rounds", str(rounds), "--size", str(size)]  # fmt: skip


def _attempts(kind: str, argv: list[str], traced: bool) -> Usage:
    """Run a client (with perftest's server first, for perftest), retrying
    while a perftest server is not listening yet."""
    stop = None
    if kind.startswith("ib_send_lat"):
        stop = perftest.start_local(argv[:-1])
    try:
        for attempt in range(20):
            try:
                return _popen_usage(argv, traced)
            except RuntimeError:
                if attempt == 19 or stop is None:
                    raise
                time.sleep(0.3)
        raise AssertionError("unreachable")
    finally:
        if stop is not None:
            stop()


def measure(kind: str, addr: str, port: int, tcp_port: int, rounds: int, size: int,
            device: str, strace: bool) -> Run:  # fmt: skip
    """One kind's figures (see the module's docstring for how each is taken)."""

    def argv(count: int) -> list[str]:
        return _client_argv(kind, addr, port, tcp_port, count, size, device)

    runs = []
    for count in (rounds, 2 * rounds):
        sent = sent_packets(device)
        _, _, calls = _attempts(kind, argv(count), strace)
        runs.append((calls, sent_packets(device) - sent))
    (fewer, fewer_sent), (more, more_sent) = runs
    syscalls = {name: (more.get(name, 0) - fewer.get(name, 0)) / rounds for name in more}
    packets = (more_sent - fewer_sent) / rounds
    if kind.startswith("ib_send_lat"):
        spans = []
        for count in (rounds, 5 * rounds):
            busy = machine_cpu()
            out, usage, _ = _attempts(kind, argv(count), False)
            spans.append((*usage, *(b - a for a, b in zip(busy, machine_cpu(), strict=True))))
        row = perftest.parse_row(out)
        if row is None:
            raise RuntimeError(f"{kind} printed no result")
        latency = perftest.to_result("send_lat", row, 1).latency
        assert latency is not None
        switches, user, system, machine, softirq = (
            (b - a) / (4 * rounds) for a, b in zip(*spans, strict=True)
        )
        return Run(latency.p50, switches, user * 1e6, system * 1e6, machine * 1e6,
                   softirq * 1e6, packets, syscalls)  # fmt: skip
    out, _, _ = _attempts(kind, argv(rounds), False)
    own = json.loads(out.splitlines()[-1])  # UCX may log to stdout first
    us = {name: own[name] / rounds * 1e6
          for name in ("user_s", "system_s", "machine_s", "softirq_s")}  # fmt: skip
    return Run(own["p50_us"], own["switches"] / rounds, us["user_s"], us["system_s"],
               us["machine_s"], us["softirq_s"], packets, syscalls)  # fmt: skip


# -- the client processes ------------------------------------------------------


async def _client(what: str, addr: str, port: int, rounds: int, size: int) -> list[float]:
    """``rounds`` timed round trips of ``size`` bytes, after a warm-up."""
    payload = bytes(size)
    if what == "tcp":
        async with await tcp.Framed.connect(addr, port, "ping") as framed:
            return await _timed(rounds, lambda: framed.ping(payload))
    import aiordma

    if what == "ucxx":
        return await _ucxx_client(addr, port, rounds, size)
    if what == "verbs":
        async with await aiordma.connect(addr, port, private_data=b"echo") as conn:
            local, inbox = conn.alloc(size), conn.alloc(size)

            async def ping() -> None:
                (reply,) = await conn.post_recv_batch([inbox])
                await conn.post_send(local)
                await reply

            return await _timed(rounds, ping)
    async with await aiordma.open_channel(addr, port, private_data=b"msgecho") as channel:

        async def message() -> None:
            await channel.send_message(payload)
            await channel.recv_message()

        return await _timed(rounds, message)


# -- UCXX, when asked for: its client and echo server run in ``--ucxx``'s interpreter --

UCXX_PYTHON: list[str] = []
"""The interpreter that runs UCXX's client and server (``--ucxx``), once set."""

UCXX_PORT = 13337


def _ucxx() -> Any:
    """UCXX, imported after its settings for this lab: rc_verbs on the device,
    and the "blocking" progress mode (its descriptor on the running loop)."""
    os.environ.setdefault("UCX_TLS", "rc_verbs,self")
    os.environ.setdefault("UCX_NET_DEVICES", os.environ.get("AIORDMA_DEVICE", "rxe0") + ":1")
    os.environ.setdefault("UCXPY_PROGRESS_MODE", "blocking")
    import ucxx  # type: ignore[import-not-found]

    return ucxx


async def _ucxx_client(addr: str, port: int, rounds: int, size: int) -> list[float]:
    """One tagged send each way, the size known to both ends (no header)."""
    import numpy

    ucxx = _ucxx()
    endpoint = await ucxx.create_endpoint(addr, port)
    out, back = numpy.zeros(size, dtype="u1"), numpy.empty(size, dtype="u1")

    async def ping() -> None:
        await endpoint.send(out)
        await endpoint.recv(back)

    try:
        return await _timed(rounds, ping)
    finally:
        await endpoint.close()


async def _ucxx_echo(port: int, size: int) -> None:
    """Echo messages of ``size`` bytes to each client until it goes, forever."""
    import numpy

    ucxx = _ucxx()

    async def echo(endpoint: Any) -> None:
        buffer = numpy.empty(size, dtype="u1")
        try:
            while True:
                await endpoint.recv(buffer)
                await endpoint.send(buffer)
        except ucxx.exceptions.UCXError:  # the client closed its endpoint
            pass

    listener = ucxx.create_listener(echo, port)
    print("listening", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        listener.close()


def _start_ucxx_server(size: int) -> subprocess.Popen[str]:
    """UCXX's echo server, listening once this returns."""
    server = subprocess.Popen([UCXX_PYTHON[0], "-m", __name__, "--serve-ucxx", "--size",
                               str(size)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert server.stdout is not None
    printed = []
    for line in server.stdout:  # UCX may log to stdout first
        if line.strip() == "listening":
            return server
        printed.append(line)
    raise RuntimeError(f"UCXX's echo server did not start (exit status {server.wait()}): "
                       + "".join(printed)[-400:])  # fmt: skip


def machine_cpu() -> tuple[float, float]:
    """Seconds all CPUs have been busy (user, system, interrupts) and in
    softirqs, from ``/proc/stat``: the peer's share and rxe's (much of it in
    softirqs, charged to whichever process they interrupt) included."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:8]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / hz, softirq / hz


USAGE: dict[str, float] = {}
"""The client's resource usage over its timed loop (set by :func:`_timed`)."""


PERF_CONTROL: list[str] = []
"""The control FIFO of the ``perf record`` this client runs under, if any."""


def _perf(command: str) -> None:
    """Tell the ``perf record`` this client runs under to ``enable`` or ``disable``."""
    if PERF_CONTROL:
        with open(PERF_CONTROL[0], "w") as control:
            control.write(command + "\n")


async def _timed(rounds: int, op: Callable[[], Awaitable[object]]) -> list[float]:
    for _ in range(100):
        await op()
    samples: list[float] = []
    clock = time.perf_counter
    _perf("enable")
    before, busy = resource.getrusage(resource.RUSAGE_SELF), machine_cpu()
    for _ in range(rounds):
        start = clock()
        await op()
        samples.append(clock() - start)
    after, busy_after = resource.getrusage(resource.RUSAGE_SELF), machine_cpu()
    _perf("disable")
    USAGE.update(switches=after.ru_nvcsw - before.ru_nvcsw,
                 user_s=after.ru_utime - before.ru_utime,
                 system_s=after.ru_stime - before.ru_stime,
                 machine_s=busy_after[0] - busy[0], softirq_s=busy_after[1] - busy[1])  # fmt: skip
    return samples


def _run(work: Coroutine[Any, Any, T], loop: str) -> T:
    """Run ``work`` on a new event loop of the kind named (``uvloop`` or asyncio's)."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(work)
    return asyncio.run(work)


def _client_main(args: argparse.Namespace) -> None:
    if args.perf_control:
        PERF_CONTROL.append(args.perf_control)
    samples = _run(_client(args.client, args.addr, args.port, args.rounds, args.size),
                   args.loop)  # fmt: skip
    print(json.dumps({"p50_us": percentile(samples, 0.5) * 1e6, **USAGE}))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated, of: " + ", ".join((*KINDS, UCXX)))  # fmt: skip
    parser.add_argument("--device", default=os.environ.get("AIORDMA_DEVICE", "rxe0"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ucxx", metavar="PYTHON",
                        help=f"the interpreter (with ucxx) for the {UCXX!r} kind")  # fmt: skip
    parser.add_argument("--ucx-lib", metavar="DIR",
                        help="the install prefix of the UCX that UCXX should load")  # fmt: skip
    parser.add_argument("--client", choices=("tcp", "verbs", "aiordma", "ucxx"),
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--serve-ucxx", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="uvloop", help=argparse.SUPPRESS)
    parser.add_argument("--addr", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--perf-control", help=argparse.SUPPRESS)
    parser.add_argument("--perf", metavar="DIR",
                        help="also profile each Python client's timed loop with perf "
                        "(cpu-clock samples; data and reports kept in DIR)")  # fmt: skip
    args = parser.parse_args()
    if args.client:
        _client_main(args)
        return
    if args.serve_ucxx:
        _run(_ucxx_echo(UCXX_PORT, args.size), "uvloop")
        return
    from aiordma.bench.runner import Peer

    kinds = args.kinds.split(",")
    for kind in kinds:
        if kind not in (*KINDS, UCXX):
            parser.error(f"unknown kind {kind!r}: use {', '.join((*KINDS, UCXX))}")
    if UCXX in kinds:
        if not args.ucxx:
            parser.error(f"{UCXX!r} needs --ucxx PYTHON (an interpreter with ucxx)")
        UCXX_PYTHON.append(args.ucxx)
        if args.ucx_lib:  # the children inherit it; only UCXX loads from there
            os.environ["RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY"] = "true"
            os.environ["LD_LIBRARY_PATH"] = ":".join(
                filter(None, (os.path.join(args.ucx_lib, "lib"),
                              os.environ.get("LD_LIBRARY_PATH"))))  # fmt: skip
    addr = lab_address()
    strace = shutil.which("strace") is not None
    peer = Peer.start(addr, max(args.size, 4096), "uvloop")
    ucxx_server = _start_ucxx_server(args.size) if UCXX in kinds else None
    rows: dict[str, Any] = {}
    try:
        for kind in kinds:
            run = measure(kind, addr, peer.port, peer.tcp_port, args.rounds, args.size,
                          args.device, strace)  # fmt: skip
            per_round = sorted(run.syscalls.items(), key=lambda item: -item[1])
            rows[kind] = {
                "p50_us": run.p50_us,
                "wakeups_per_round_trip": run.wakeups,
                "user_us_per_round_trip": run.user_us,
                "system_us_per_round_trip": run.system_us,
                "machine_us_per_round_trip": run.machine_us,
                "softirq_us_per_round_trip": run.softirq_us,
                "packets_per_round_trip": run.packets,
                "syscalls_per_round_trip": {n: c for n, c in per_round if c > 0},
            }
            if args.perf and not kind.startswith("ib_send_lat"):
                client = _client_argv(kind, addr, peer.port, peer.tcp_port, args.rounds,
                                      args.size, args.device)  # fmt: skip
                rows[kind]["cpu_by_object"] = profile(kind, args.perf, client)
            if not args.json:
                _print_row(kind, rows[kind])
    finally:
        peer.close()
        if ucxx_server is not None:
            ucxx_server.terminate()
            ucxx_server.wait()
    if args.json:
        print(json.dumps({"size": args.size, "rounds": args.rounds, "kinds": rows}))


def profile(kind: str, directory: str, argv: list[str]) -> dict[str, float]:
    """The share of the client's CPU samples in each shared object (the
    interpreter, uvloop, aiordma's compiled modules, rdma-core, the kernel),
    over its timed loop only; ``perf report``'s tables kept in ``directory``."""
    os.makedirs(directory, exist_ok=True)
    name = kind.replace(" ", "-")
    data = os.path.join(directory, f"{name}.data")
    control = os.path.join(tempfile.mkdtemp(), "control")  # a FIFO: not on every file system
    os.mkfifo(control)
    record = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4999", "-D", "-1",
              "--control", f"fifo:{control}", "-o", data, "--", *argv,
              "--perf-control", control]  # fmt: skip
    _popen_usage(record, False)
    shares: dict[str, float] = {}
    for sort, keep in (("dso", True), ("dso,sym", False)):
        report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", sort],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
        with open(os.path.join(directory, f"{name}.{sort.replace(',', '-')}.txt"), "w") as out:
            out.write(report)
        if keep:
            for line in report.splitlines():
                fields = line.split()
                if len(fields) >= 2 and fields[0].endswith("%") and not line.startswith("#"):
                    shares[fields[1]] = float(fields[0][:-1])
    return shares


def _print_row(kind: str, row: dict[str, Any]) -> None:
    calls = row["syscalls_per_round_trip"]
    total = calls.get("total")
    named = ", ".join(f"{name} {n:.1f}" for name, n in calls.items() if name != "total"
                      and n >= 0.5)  # fmt: skip
    syscalls = f"{total:5.1f} syscalls ({named})" if total is not None else "no strace"
    print(f"{kind:<16} p50 {row['p50_us']:7.1f} us  cpu {row['user_us_per_round_trip']:6.1f} "
          f"user + {row['system_us_per_round_trip']:6.1f} sys us  "
          f"machine {row['machine_us_per_round_trip']:4.0f} us "
          f"(softirq {row['softirq_us_per_round_trip']:3.0f})  "
          f"{row['wakeups_per_round_trip']:4.1f} wake-ups  "
          f"{row['packets_per_round_trip']:4.1f} packets  {syscalls}", flush=True)  # fmt: skip
    shares = row.get("cpu_by_object")
    if shares:
        top = sorted(shares.items(), key=lambda item: -item[1])[:8]
        print("    cpu by object: " + ", ".join(f"{name} {share:.0f}%" for name, share in top))


if __name__ == "__main__":
    main()
