"""The project's measurements: kept in the repository, not shipped in the wheel.

``python -m benchmarks NAME [ARGS...]`` runs study ``NAME`` (a module of
:mod:`benchmarks.studies`, one lever each) with its own arguments; each
module's docstring says what it measures, and the decision record in
``docs/decisions/`` that cites it says what was decided. ``records/`` holds
the scripts each record's figures came from. ``aiordma bench`` (shipped)
stays the runner users need.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any


def names() -> list[str]:
    """The studies there are."""
    from benchmarks import studies

    return sorted(m.name for m in pkgutil.iter_modules(studies.__path__) if m.name[0] != "_")


def run(name: str, argv: Sequence[str]) -> int:
    """Run study ``name`` with ``argv`` as its command line; its exit status."""
    if name not in names():
        print(f"benchmarks: no study {name!r} (there are: {', '.join(names())})",
              file=sys.stderr)  # fmt: skip
        return 2
    module = importlib.import_module(f"benchmarks.studies.{name}")
    saved = sys.argv
    sys.argv = [f"python -m benchmarks {name}", *argv]
    try:
        result = module.main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return result if isinstance(result, int) else 0


def lab_address() -> str:
    """The IPv4 address of this machine's RoCE device; exits if there is none."""
    from aiordma.verbs.discovery import find_roce_endpoint

    endpoint = find_roce_endpoint()
    if endpoint is None:
        raise SystemExit("no RoCE device with an IPv4 address (run it in 'aiordma lab')")
    return str(endpoint.address)


def study_parser(doc: str | None) -> argparse.ArgumentParser:
    """A study's command line: described by its docstring's first line, with
    ``--json`` (print the figures as JSON) and the hidden ``--serve HOST``
    (run as the study's own peer process)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--serve", metavar="HOST", help=argparse.SUPPRESS)
    return parser


def printed_json(args: argparse.Namespace, figures: Any) -> bool:
    """Print ``figures`` as JSON if ``--json`` was given; whether it was."""
    if args.json:
        print(json.dumps(figures))
    return bool(args.json)
