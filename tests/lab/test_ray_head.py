"""The Ray head helper's pure parts (host only): which process is a raylet, what it waits for."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiordma.lab import ray_head
from aiordma.lab.ray_head import (
    AGENT_GRPC_PORT,
    AGENT_LISTEN_PORT,
    METRICS_EXPORT_PORT,
    agent_port_files,
    main,
    raylet_session,
    write_port_files,
)


def test_a_raylet_is_known_by_its_command_line() -> None:
    args = ["/venv/lib/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/s",
            "--node_id=abc123", "--session_dir=/tmp/ray/session_1", "--other=x"]  # fmt: skip
    assert raylet_session(args) == ("abc123", "/tmp/ray/session_1")
    assert raylet_session(["/usr/bin/python3", "--node_id=abc", "--session_dir=/x"]) is None
    assert raylet_session(args[:3]) is None  # no session directory
    assert raylet_session([]) is None


def test_the_files_hold_what_the_agent_writes() -> None:
    assert agent_port_files(minimal=True) == {
        "metrics_agent_port": -1, "metrics_export_port": -1, "dashboard_agent_listen_port": -1,
    }  # fmt: skip
    assert agent_port_files(minimal=False) == {
        "metrics_agent_port": AGENT_GRPC_PORT, "metrics_export_port": METRICS_EXPORT_PORT,
        "dashboard_agent_listen_port": AGENT_LISTEN_PORT,
    }  # fmt: skip


def test_files_the_agent_wrote_first_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "metrics_agent_port_n1").write_text("5555")
    write_port_files(str(tmp_path), "n1", agent_port_files(minimal=True))
    assert (tmp_path / "metrics_agent_port_n1").read_text() == "5555"
    assert (tmp_path / "metrics_export_port_n1").read_text() == "-1"
    assert (tmp_path / "dashboard_agent_listen_port_n1").read_text() == "-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dashboard_agent_listen_port_n1", "metrics_agent_port_n1", "metrics_export_port_n1",
    ]  # fmt: skip


def test_the_command_line_refuses_an_unknown_command() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["start"])
    assert exc.value.code == 2


@pytest.fixture
def slow_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``ray`` command that takes a minute over anything (a loaded host's)."""
    ray = tmp_path / "ray"
    ray.write_text("#!/bin/sh\necho starting; exec sleep 60\n")
    ray.chmod(0o755)
    monkeypatch.setattr(ray_head, "ray_command", lambda: str(ray))
    monkeypatch.setattr(ray_head, "dashboard_is_minimal", lambda: True)
    return ray


def test_a_late_stop_is_reported_not_raised(slow_ray: Path) -> None:
    """Issue 62: ``subprocess.TimeoutExpired`` escaped a user's ``finally``."""
    with pytest.warns(RuntimeWarning, match=r"ray stop did not finish within 0.5 s"):
        assert ray_head.stop_head(timeout=0.5) is False


def test_a_late_start_says_what_to_do(slow_ray: Path) -> None:
    with pytest.raises(RuntimeError, match=r"ray start did not finish within 0.5 s .*timeout="):
        ray_head.start_head(timeout=0.5)
