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

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

AGENT_GRPC_PORT = 61001
METRICS_EXPORT_PORT = 61002
AGENT_LISTEN_PORT = 61003
RUNTIME_ENV_AGENT_PORT = 61004
START_TIMEOUT = 600.0
"""Seconds ``ray start`` may take in a guest (about two minutes seen)."""


def agent_port_files(minimal: bool) -> dict[str, int]:
    """The port files the raylet waits for, and what the agent writes in them."""
    if minimal:
        return {"metrics_agent_port": -1, "metrics_export_port": -1,
                "dashboard_agent_listen_port": -1}  # fmt: skip
    return {"metrics_agent_port": AGENT_GRPC_PORT, "metrics_export_port": METRICS_EXPORT_PORT,
            "dashboard_agent_listen_port": AGENT_LISTEN_PORT}  # fmt: skip


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


def start_head(*, temp_dir: str = "/tmp/ray", num_cpus: int | None = None,
               port: int = 6379, timeout: float = START_TIMEOUT) -> Head:  # fmt: skip
    """Start a Ray head here (``ray start --head``, dashboard off, usage stats
    off) with the agents' port files written early; stop it with :func:`stop_head`.
    Raises RuntimeError with ``ray start``'s output if it fails."""
    ray = ray_command()
    if ray is None:
        raise RuntimeError("no 'ray' command beside this Python or on PATH: install aiordma[ray]")
    stop = threading.Event()
    writer = threading.Thread(target=_prewrite, args=(agent_port_files(dashboard_is_minimal()),
                                                      stop), daemon=True)  # fmt: skip
    writer.start()
    command = [ray, "start", "--head", f"--port={port}", "--include-dashboard=false",
               "--disable-usage-stats", f"--temp-dir={temp_dir}",
               f"--dashboard-agent-grpc-port={AGENT_GRPC_PORT}",
               f"--metrics-export-port={METRICS_EXPORT_PORT}",
               f"--dashboard-agent-listen-port={AGENT_LISTEN_PORT}",
               f"--runtime-env-agent-port={RUNTIME_ENV_AGENT_PORT}"]  # fmt: skip
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.setdefault("RAY_worker_register_timeout_seconds", "600")  # actors import Ray slowly here
    start = time.monotonic()
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        stop.set()
        writer.join()
    if out.returncode != 0:
        raise RuntimeError(f"ray start failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return Head(f"127.0.0.1:{port}", time.monotonic() - start)


def ray_command() -> str | None:
    """The ``ray`` script of this Python's environment (else the one on PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    return beside if os.access(beside, os.X_OK) else shutil.which("ray")


def stop_head() -> None:
    """``ray stop --force``: every Ray process of this machine."""
    ray = ray_command()
    if ray is not None:
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120)
