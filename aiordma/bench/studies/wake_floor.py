"""The floor of an awaited round trip: where a small message's time goes, beside C and TCP.

    aiordma lab -- aiordma bench study wake_floor [--rounds 1000] [--size 64] [--json]

One boot, one peer process (uvloop), and a ping-pong of ``--size`` bytes
measured by client processes of each kind:

* ``ib_send_lat`` busy polling, and with ``-e`` (waiting on the completion
  channel: the C floor for any design that sleeps until the adapter
  signals);
* a framed TCP ping-pong (:class:`aiordma.bench.tcp.Framed`) on asyncio and
  on uvloop;
* a :class:`~aiordma.MessageChannel` ping-pong on asyncio and on uvloop.

For each: the median round trip, and per round trip the client's
voluntary context switches (each one a sleep in ``epoll_wait`` or a
blocking read: the process's wake-ups) and its system calls (``strace -c``,
when strace is installed; by name for the most frequent). Counts come from
two runs, of ``rounds`` and ``2 * rounds`` round trips, and their
difference, so start-up is not counted; the latency comes from the longer
run, without strace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from aiordma.bench import perftest, tcp
from aiordma.bench.stats import percentile
from aiordma.bench.studies import lab_address

KINDS = ("ib_send_lat", "ib_send_lat -e", "tcp asyncio", "tcp uvloop",
         "aiordma asyncio", "aiordma uvloop")  # fmt: skip


@dataclass
class Run:
    """What one client process reported."""

    p50_us: float
    switches: int
    syscalls: dict[str, int] = field(default_factory=dict)


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


def _popen_usage(argv: list[str], strace: bool) -> tuple[str, int, dict[str, int]]:
    """Run ``argv`` (under ``strace -c`` if asked): its output, its voluntary
    context switches (by ``wait4``) and its system calls by name."""
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
        return stdout, usage.ru_nvcsw, strace_counts(trace) if strace else {}
    finally:
        os.unlink(trace)


def _client_argv(kind: str, addr: str, port: int, tcp_port: int, rounds: int, size: int,
                 device: str) -> list[str]:  # fmt: skip
    if kind.startswith("ib_send_lat"):
        argv = ["ib_send_lat", "-d", device, "-R", "-F", "-s", str(size), "-n", str(rounds),
                "-p", str(perftest.PORT)]  # fmt: skip
        return [*argv, *(["-e"] if kind.endswith("-e") else []), addr]
    what, loop = kind.split()
    return [sys.executable, "-m", __name__, "--client", what, "--loop", loop, "--addr", addr,
            "--port", str(port if what == "aiordma" else tcp_port), "--rounds", str(rounds),
            "--size", str(size)]  # fmt: skip


def measure(kind: str, addr: str, port: int, tcp_port: int, rounds: int, size: int,
            device: str, strace: bool) -> Run:  # fmt: skip
    """One kind: latency from ``2 * rounds``, counts from the difference of two runs."""
    runs = []
    for count, traced in ((rounds, False), (2 * rounds, False), *(
            ((rounds, True), (2 * rounds, True)) if strace else ())):  # fmt: skip
        stop = None
        if kind.startswith("ib_send_lat"):
            server = _client_argv(kind, addr, port, tcp_port, count, size, device)[:-1]
            stop = perftest.start_local(server)
            time.sleep(0.5)  # its client retries below too
        try:
            for attempt in range(20):
                try:
                    runs.append(
                        _popen_usage(
                            _client_argv(kind, addr, port, tcp_port, count, size, device), traced
                        )
                    )
                    break
                except RuntimeError:
                    if attempt == 19 or stop is None:
                        raise
                    time.sleep(0.3)
        finally:
            if stop is not None:
                stop()
    (_, short_switches, _), (long_out, long_switches, _) = runs[0], runs[1]
    if kind.startswith("ib_send_lat"):
        row = perftest.parse_row(long_out)
        if row is None:
            raise RuntimeError(f"{kind} printed no result")
        p50 = perftest.to_result("send_lat", row, 1).latency.p50  # type: ignore[union-attr]
    else:
        p50 = json.loads(long_out)["p50_us"]
    syscalls: dict[str, int] = {}
    if strace:
        short, long = runs[2][2], runs[3][2]
        syscalls = {name: long.get(name, 0) - short.get(name, 0) for name in long}
    return Run(p50, long_switches - short_switches, syscalls)


# -- the client processes ------------------------------------------------------


async def _client(what: str, addr: str, port: int, rounds: int, size: int) -> list[float]:
    payload = bytes(size)
    samples: list[float] = []
    clock = time.perf_counter
    if what == "tcp":
        async with await tcp.Framed.connect(addr, port, "ping") as framed:
            for _ in range(rounds):
                start = clock()
                await framed.ping(payload)
                samples.append(clock() - start)
        return samples
    import aiordma

    async with await aiordma.open_channel(addr, port, private_data=b"msgecho") as channel:
        for _ in range(rounds):
            start = clock()
            await channel.send_message(payload)
            await channel.recv_message()
            samples.append(clock() - start)
    return samples


def _client_main(args: argparse.Namespace) -> None:
    work = _client(args.client, args.addr, args.port, args.rounds, args.size)
    if args.loop == "uvloop":
        import uvloop

        samples = uvloop.run(work)
    else:
        samples = asyncio.run(work)
    print(json.dumps({"p50_us": percentile(samples, 0.5) * 1e6}))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated, of: " + ", ".join(KINDS))  # fmt: skip
    parser.add_argument("--device", default=os.environ.get("AIORDMA_DEVICE", "rxe0"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--client", choices=("tcp", "aiordma"), help=argparse.SUPPRESS)
    parser.add_argument("--loop", default="uvloop", help=argparse.SUPPRESS)
    parser.add_argument("--addr", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        _client_main(args)
        return
    from aiordma.bench.runner import Peer

    addr = lab_address()
    strace = shutil.which("strace") is not None
    peer = Peer.start(addr, max(args.size, 4096), "uvloop")
    rows: dict[str, Any] = {}
    try:
        for kind in args.kinds.split(","):
            run = measure(kind, addr, peer.port, peer.tcp_port, args.rounds, args.size,
                          args.device, strace)  # fmt: skip
            per_round = sorted(run.syscalls.items(), key=lambda item: -item[1])
            rows[kind] = {
                "p50_us": run.p50_us,
                "wakeups_per_round_trip": run.switches / args.rounds,
                "syscalls_per_round_trip": {n: c / args.rounds for n, c in per_round if c > 0},
            }
            if not args.json:
                _print_row(kind, rows[kind])
    finally:
        peer.close()
    if args.json:
        print(json.dumps({"size": args.size, "rounds": args.rounds, "kinds": rows}))


def _print_row(kind: str, row: dict[str, Any]) -> None:
    calls = row["syscalls_per_round_trip"]
    total = calls.get("total")
    named = ", ".join(f"{name} {n:.1f}" for name, n in calls.items() if name != "total"
                      and n >= 0.5)  # fmt: skip
    syscalls = f"{total:5.1f} syscalls ({named})" if total is not None else "no strace"
    print(f"{kind:<16} p50 {row['p50_us']:8.1f} us  {row['wakeups_per_round_trip']:4.1f} "
          f"wake-ups  {syscalls}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
