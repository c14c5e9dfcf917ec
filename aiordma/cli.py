"""The ``aiordma`` command: device listing, Soft-RoCE set-up, the lab, benchmarks and metrics."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiordma.exceptions import LabError


def _cmd_devices(args: argparse.Namespace) -> int:
    from aiordma.verbs.discovery import format_devices, list_devices

    devices = list_devices()
    if args.json:
        rows = []
        for dev in devices:
            row = dataclasses.asdict(dev)
            for port_row, port in zip(row["ports"], dev.ports, strict=True):
                for gid_row, gid in zip(port_row["gids"], port.gids, strict=True):
                    gid_row["ip"] = None if gid.ip is None else str(gid.ip)
            rows.append(row)
        print(json.dumps(rows, indent=2))
    else:
        print(format_devices(devices))
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    import aiordma

    for key, value in aiordma.info().items():
        print(f"{key}: {value}")
    return 0


def _cmd_rxe(args: argparse.Namespace) -> int:
    from aiordma.lab.rxe import rxe_down, rxe_up

    if args.action == "up":
        rxe_up(args.netdev, args.name, args.dummy)
        print(f"{args.name} is up on {args.netdev}")
    else:
        rxe_down(args.name)
        print(f"{args.name} removed")
    return 0


def _kvm_choice(value: str) -> bool | None:
    return {"auto": None, "yes": True, "no": False}[value]


def _cmd_lab(args: argparse.Namespace) -> int:
    from aiordma.lab.runner import run_in_lab
    from aiordma.lab.vm import GuestConfig, Terminated

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        cmd = [sys.executable, "-m", "aiordma", "devices"]
    two = args.hosts == 2
    cfg = GuestConfig(
        cpus=args.cpus or int(os.environ.get("AIORDMA_LAB_CPUS", "1" if two else "2")),
        memory=args.memory or os.environ.get("AIORDMA_LAB_MEMORY", "2G" if two else "4G"),
        kvm=_kvm_choice(args.kvm),
        rwdirs=[Path(d).resolve() for d in args.rwdir],
    )
    try:
        if two:
            from aiordma.lab.fabric import FabricConfig, run_on_fabric

            mtu = (args.mtu[0], args.mtu[-1])
            preload = tuple(dict.fromkeys(["aiordma", *args.preload]))
            fabric = FabricConfig(cfg.cpus, cfg.memory, mtu, args.link, preload)
            return run_on_fabric(cmd, cfg, fabric, timeout=args.timeout)
        return run_in_lab(cmd, cfg, force_guest=args.vm, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"aiordma lab: timed out after {args.timeout} s", file=sys.stderr)
        return 124
    except Terminated as exc:
        print(f"aiordma lab: {exc}; the guest was stopped", file=sys.stderr)
        return 128 + exc.signum


def _cmd_stats(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    from aiordma.metrics import format_exposition

    try:
        with urllib.request.urlopen(args.url, timeout=args.timeout) as reply:
            text = reply.read().decode()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"aiordma: cannot read metrics from {args.url}: {exc}", file=sys.stderr)
        return 1
    print(format_exposition(text))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from aiordma.bench.command import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiordma", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(
        name: str, run: Callable[[argparse.Namespace], int], **settings: Any
    ) -> argparse.ArgumentParser:
        """The subcommand ``name`` (``settings``: ``add_parser``'s), run by ``run(args)``."""
        p = sub.add_parser(name, **settings)
        p.set_defaults(func=run)
        return p

    p = command("devices", _cmd_devices, help="list RDMA devices, ports and GIDs")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = command(
        "info", _cmd_info, help="the installation: versions and the per-message path in use"
    )

    p = command("rxe", _cmd_rxe, help="create or remove a Soft-RoCE device (needs root, rdma_rxe)")
    p.add_argument("action", choices=["up", "down"])
    p.add_argument("--name", default="rxe0", help="RDMA device name (default: rxe0)")
    p.add_argument("--netdev", default="dummy0", help="network interface (default: dummy0)")
    p.add_argument(
        "--dummy",
        metavar="ADDR/PREFIX",
        help="create NETDEV as a dummy interface with this address (e.g. 192.0.2.1/24)",
    )

    p = command(
        "lab",
        _cmd_lab,
        help="run a command where a real RDMA device exists (here, or in a QEMU guest)",
        description="Run CMD natively if this host has an active RoCE device, otherwise in a "
        "throw-away QEMU guest (virtme-ng) with rxe0 on dummy0 at 192.0.2.1 and 2001:db8::1. "
        "CMD sees AIORDMA_DEVICE, AIORDMA_ADDR and AIORDMA_ADDR6. The current directory and "
        "every --rwdir keep their writes. Without CMD, lists the lab's devices.",
    )
    p.add_argument(
        "--hosts",
        type=int,
        choices=[1, 2],
        default=1,
        help="2: two guests joined by one Ethernet link (host 1 runs CMD at 192.0.2.1, "
        "host 2 at 192.0.2.2 runs what CMD asks through aiordma.lab.remote)",
    )
    p.add_argument("--cpus", type=int, default=None, help="per guest (default 2; 1 with --hosts 2)")
    p.add_argument("--memory", default=None, help="per guest (default 4G; 2G with --hosts 2)")
    p.add_argument(
        "--mtu",
        type=int,
        nargs="+",
        default=[None],
        metavar="BYTES",
        help="with --hosts 2: the link cards' MTU (one value for both, or host 1's and host 2's)",
    )
    p.add_argument(
        "--link",
        choices=["stream", "dgram"],
        default=os.environ.get("AIORDMA_LAB_LINK", "stream"),
        help="with --hosts 2: what joins the guests: a stream (no loss: a frame waits "
        "until the other side takes it) or UDP datagrams (dropped when the other side "
        "cannot take them in time); default stream, or $AIORDMA_LAB_LINK",
    )
    p.add_argument(
        "--preload",
        action="append",
        default=[],
        metavar="MODULE",
        help="with --hosts 2: a module host 2 imports once (aiordma always); its Python "
        "programs start as forks of that interpreter instead of fresh ones",
    )
    p.add_argument(
        "--kvm",
        choices=["auto", "yes", "no"],
        default=os.environ.get("AIORDMA_LAB_KVM", "auto"),
        help="auto probes once whether KVM really boots here and caches the verdict",
    )
    p.add_argument("--rwdir", action="append", default=[], help="another writable directory")
    p.add_argument("--vm", action="store_true", help="use a guest even if this host has RDMA")
    p.add_argument("--timeout", type=float, default=None, help="kill the run after this many s")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")

    p = command(
        "stats",
        _cmd_stats,
        help="print the metrics of a running process (from its Prometheus endpoint)",
        description="Read the aiordma metrics a process exports (aiordma.prometheus.register() "
        "and prometheus_client's HTTP server) and print them per server and connection.",
    )
    p.add_argument(
        "url",
        nargs="?",
        default="http://127.0.0.1:9464/metrics",
        help="the process's metrics URL (default: http://127.0.0.1:9464/metrics)",
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for it")

    from aiordma.bench.command import add_arguments

    p = command(
        "bench",
        _cmd_bench,
        help="measure latency and bandwidth, optionally next to perftest",
        description="Measure aiordma on a real device (run it inside 'aiordma lab -- ...' "
        "without one), against a peer process. --compare perftest runs the matching "
        "perftest tool on the same device with the same sizes and prints the ratio.",
    )
    add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(given)
    try:
        rc: int = args.func(args)
    except LabError as exc:
        print(f"aiordma: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (`aiordma devices | head -1`): not an error
        # What is left in stdout's buffer has nowhere to go at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
