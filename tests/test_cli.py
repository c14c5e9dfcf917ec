"""The ``aiordma`` command's own behaviour (its reference: tests/docs/test_cli_reference.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from aiordma import cli


def test_each_subcommand_runs_its_own_handler() -> None:
    parser = cli.build_parser()
    runs = {
        ("devices",): cli._cmd_devices,
        ("info",): cli._cmd_info,
        ("rxe", "up"): cli._cmd_rxe,
        ("lab",): cli._cmd_lab,
        ("stats",): cli._cmd_stats,
        ("bench", "send_lat"): cli._cmd_bench,
    }
    for argv, handler in runs.items():
        assert parser.parse_args(list(argv)).func is handler, argv


def test_a_reader_that_leaves_early_is_not_a_crash() -> None:
    # `aiordma info | head -1` once printed a BrokenPipeError traceback.
    read, write = os.pipe()
    os.close(read)  # gone before the first line: the first write fails
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "aiordma", "info"],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert proc.returncode == 1
    assert proc.stderr == ""
