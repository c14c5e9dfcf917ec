"""A Ray head that starts in a slow guest: agents' port files written early.

Under the lab's CPU emulation Ray's dashboard agent (plain Python) needs
30-60 s to load, while the raylet waits about 30 s for the agent's port
files and then aborts (``Timed out waiting for file
.../dashboard_agent_listen_port_<node>``); no setting lengthens that wait.
The agent writes those files itself once loaded, with values known in
advance: the fixed ports given to ``ray start``, or ``-1`` when the agent is
the minimal one (plain ``ray``, without the dashboard's extras).
:func:`start_head` writes the same values as soon as the raylet runs, so
the raylet goes on and the agent catches up later. On a fast host it changes
nothing. The Ray guide (``docs/guides/ray.md``) tells the story.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass

AGENT_GRPC_PORT = 61001
METRICS_EXPORT_PORT = 61002
AGENT_LISTEN_PORT = 61003
RUNTIME_ENV_AGENT_PORT = 61004
START_TIMEOUT = 600.0
"""Seconds ``ray start`` may take in a guest (42-118 s seen in a quiet one;
a loaded host takes several times that)."""
STOP_TIMEOUT = 600.0
"""Seconds ``ray stop --force`` may take in a guest (past 120 s seen on a
loaded host)."""


def agent_port_files(minimal: bool) -> dict[str, int]:
    """The port files the raylet waits for, and what the agent writes in them."""
    if minimal:
        return {
            "metrics_agent_port": -1,
            "metrics_export_port": -1,
            "dashboard_agent_listen_port": -1,
        }
    return {
        "metrics_agent_port": AGENT_GRPC_PORT,
        "metrics_export_port": METRICS_EXPORT_PORT,
        "dashboard_agent_listen_port": AGENT_LISTEN_PORT,
    }


def raylet_session(args: list[str]) -> tuple[str, str] | None:
    """``(node_id, session_dir)`` from a raylet's command line; None for another process."""
    if not args or not args[0].endswith("/raylet"):
        return None
    found = {}
    for arg in args[1:]:
        name, _, value = arg.partition("=")
        if name in ("--node_id", "--session_dir"):
            found[name] = value
    if len(found) != 2:
        return None
    return found["--node_id"], found["--session_dir"]


def _raylets() -> list[tuple[str, str]]:
    seen = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        found = raylet_session(args)
        if found is not None:
            seen.append(found)
    return seen


def write_port_files(session_dir: str, node_id: str, ports: dict[str, int]) -> None:
    """Write each ``<name>_<node_id>`` file the agent has not written yet (atomically)."""
    for name, port in ports.items():
        path = os.path.join(session_dir, f"{name}_{node_id}")
        if os.path.exists(path):
            continue
        with open(path + ".aiordma", "w") as f:
            f.write(str(port))
        os.replace(path + ".aiordma", path)


def _prewrite(ports: dict[str, int], stop: threading.Event) -> None:
    done: set[str] = set()
    while not stop.wait(0.2):
        for node_id, session_dir in _raylets():
            if node_id not in done and os.path.isdir(session_dir):
                write_port_files(session_dir, node_id, ports)
                done.add(node_id)
        if done:
            return


@dataclass(frozen=True)
class Head:
    """A running head: its address (for ``ray.init(address=...)``) and how long it took."""

    address: str
    seconds: float


def dashboard_is_minimal() -> bool:
    """Whether Ray's dashboard agent runs minimal here (plain ``ray``, no extras)."""
    from ray._private.utils import get_dashboard_dependency_error

    return get_dashboard_dependency_error() is not None


def start_head(
    *,
    temp_dir: str = "/tmp/ray",
    num_cpus: int | None = None,
    port: int = 6379,
    node_ip: str | None = None,
    resources: dict[str, float] | None = None,
    timeout: float = START_TIMEOUT,
) -> Head:
    """Start a Ray head here (``ray start --head``, dashboard off, usage stats
    off) with the agents' port files written early; stop it with :func:`stop_head`.
    ``node_ip``: the address other nodes reach it at (Ray's guess when None).
    Raises RuntimeError with ``ray start``'s output if it fails."""
    host = node_ip or "127.0.0.1"
    seconds = _ray_start(
        ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp_dir}"],
        num_cpus,
        node_ip,
        resources,
        timeout,
    )
    return Head(f"{host}:{port}", seconds)


def join(
    address: str,
    *,
    num_cpus: int | None = None,
    node_ip: str | None = None,
    resources: dict[str, float] | None = None,
    timeout: float = START_TIMEOUT,
) -> float:
    """Start a Ray worker node here that joins the head at ``address``
    (``ray start --address``), as :func:`start_head` does; the seconds it took."""
    return _ray_start([f"--address={address}"], num_cpus, node_ip, resources, timeout)


def _ray_start(
    first: list[str],
    num_cpus: int | None,
    node_ip: str | None,
    resources: dict[str, float] | None,
    timeout: float,
) -> float:
    ray = ray_command()
    if ray is None:
        raise RuntimeError("no 'ray' command beside this Python or on PATH: install aiordma[ray]")
    stop = threading.Event()
    writer = threading.Thread(
        target=_prewrite, args=(agent_port_files(dashboard_is_minimal()), stop), daemon=True
    )
    writer.start()
    command = [
        ray,
        "start",
        *first,
        "--disable-usage-stats",
        f"--dashboard-agent-grpc-port={AGENT_GRPC_PORT}",
        f"--metrics-export-port={METRICS_EXPORT_PORT}",
        f"--dashboard-agent-listen-port={AGENT_LISTEN_PORT}",
        f"--runtime-env-agent-port={RUNTIME_ENV_AGENT_PORT}",
    ]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    if node_ip is not None:
        command.append(f"--node-ip-address={node_ip}")
    if resources:
        command.append(f"--resources={json.dumps(resources)}")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.setdefault("RAY_worker_register_timeout_seconds", "600")  # actors import Ray slowly here
    start = time.monotonic()
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(
            f"ray start did not finish within {timeout:g} s (a loaded host? give a larger "
            f"timeout=); Ray processes it started may still run: stop_head() ends them\n"
            f"{_text(exc.stdout)}\n{_text(exc.stderr)}"
        ) from None
    finally:
        stop.set()
        writer.join()
    if out.returncode != 0:
        raise RuntimeError(f"ray start failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return time.monotonic() - start


def ray_command() -> str | None:
    """The ``ray`` script of this Python's environment (else the one on PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    return beside if os.access(beside, os.X_OK) else shutil.which("ray")


def stop_head(*, timeout: float = STOP_TIMEOUT) -> bool:
    """``ray stop --force``: every Ray process of this machine. False (and a
    ``RuntimeWarning``) if it did not finish within ``timeout`` seconds:
    a late stop is reported, never raised through the caller's ``finally``."""
    ray = ray_command()
    if ray is None:
        return True
    try:
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        warnings.warn(
            f"ray stop did not finish within {timeout:g} s: Ray processes may still run",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def main(argv: list[str] | None = None) -> None:
    """``python -m aiordma.lab.ray_head join ADDRESS [--node-ip IP] [--resources JSON]``
    or ``... stop``: for the second host of the two-host lab."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m aiordma.lab.ray_head")
    sub = parser.add_subparsers(dest="command", required=True)
    joining = sub.add_parser("join", help="start a worker node joining ADDRESS")
    joining.add_argument("address")
    joining.add_argument("--node-ip")
    joining.add_argument("--num-cpus", type=int)
    joining.add_argument("--resources", type=json.loads)
    sub.add_parser("stop", help="stop every Ray process here")
    args = parser.parse_args(argv)
    if args.command == "join":
        seconds = join(
            args.address, num_cpus=args.num_cpus, node_ip=args.node_ip, resources=args.resources
        )
        print(f"joined {args.address} in {seconds:.1f} s", flush=True)
    elif not stop_head():
        raise SystemExit(1)


if __name__ == "__main__":
    main()
