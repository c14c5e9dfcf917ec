"""Snippets outside the tutorial cannot rot silently either.

The tutorial's programs run in the lab (``test_tutorial.py``). The other pages
hold fragments (a handler, a ``gather``, a shutdown sequence) that need a peer
or a third-party framework to run, so here they are checked on the host: each
parses, each ``aiordma.X``/``rpc.X`` it names exists, each method it calls on
an aiordma object of a known kind exists on that kind, and each ``aiordma``
command line it shows uses a real subcommand and real options.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import inspect
import re
import shlex
from pathlib import Path
from types import ModuleType

import pytest

import aiordma
import benchmarks
from aiordma import rpc, transfer
from aiordma.cli import build_parser
from aiordma.lab.remote import Fabric, PeerProcess

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
]

# Names the fragments use for aiordma objects, by the class they stand for.
RECEIVERS: dict[str, type] = {
    "conn": aiordma.Connection,
    "client": rpc.Client,
    "service": rpc.Service,
    "server": aiordma.Server,
    "pool": aiordma.MemoryRegion,
    "region": aiordma.MemoryRegion,
    "channel": aiordma.MessageChannel,
    "dev": aiordma.Device,
    "qp": aiordma.QueuePair,
    "fabric": Fabric,
    "remote": PeerProcess,
    "agent": transfer.Agent,
    "kv_pool": transfer.Registration,
    "staging": transfer.Registration,
    "note": transfer.Notification,
}
MODULES = {"aiordma": aiordma, "rpc": rpc, "transfer": transfer}


def _has(cls: type, name: str) -> bool:
    """A class attribute, or an instance attribute its methods assign."""
    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}:
        return True
    for klass in cls.__mro__[:-1]:
        for node in ast.walk(ast.parse(inspect.getsource(klass))):
            targets = (
                [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
            )
            if any(isinstance(t, ast.Attribute) and t.attr == name for t in targets):
                return True
    return False


def _blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for i, code in enumerate(re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.S)):
            found.append((f"{page.relative_to(ROOT)}#{i}", code))
    return found


PYTHON = _blocks("python")


def test_the_pages_have_python_snippets() -> None:
    assert len(PYTHON) >= 10


def _has_member(module: ModuleType, name: str) -> bool:
    """An attribute of ``module``, or a submodule of it (imported or not yet)."""
    if hasattr(module, name):
        return True
    return importlib.util.find_spec(f"{module.__name__}.{name}") is not None


@pytest.mark.parametrize(("where", "code"), PYTHON, ids=[w for w, _ in PYTHON])
def test_python_snippet_names_real_api(where: str, code: str) -> None:
    tree = compile(code, where, "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    unknown = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            continue
        base = node.value.id
        if base in MODULES and not _has_member(MODULES[base], node.attr):
            unknown.append(f"{base}.{node.attr}")
        elif base in RECEIVERS and not _has(RECEIVERS[base], node.attr):
            unknown.append(f"{base}.{node.attr} ({RECEIVERS[base].__name__})")
    assert unknown == []


def _commands() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the CLI has no subcommands")


def _mentions() -> list[tuple[str, str]]:
    """``aiordma ...`` in backticks: a command with placeholders."""
    lines = []
    for page in PAGES:
        lines += [
            (str(page.relative_to(ROOT)), m)
            for m in re.findall(r"`(aiordma [^`]+)`", page.read_text())
        ]
    return lines


def _shell_commands() -> list[tuple[str, list[str]]]:
    """Complete ``aiordma`` command lines in shell blocks, continuations joined."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```(?:sh|console|bash)\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                starts = [i for i, w in enumerate(words) if Path(w).name == "aiordma"]
                for n, start in enumerate(starts):
                    end = starts[n + 1] - 1 if n + 1 < len(starts) else len(words)
                    found.append((str(page.relative_to(ROOT)), words[start + 1 : end]))
    return found


def test_shell_commands_parse() -> None:
    commands = _shell_commands()
    assert len(commands) >= 8
    parser = build_parser()
    rejected = []
    for where, argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit:
            rejected.append(f"{where}: aiordma {' '.join(argv)}")
    assert rejected == []


def test_mentioned_commands_and_options_exist() -> None:
    commands = _commands()
    mentions = _mentions()
    assert len(mentions) >= 20
    wrong = []
    for where, line in mentions:
        words = line.replace("[", " ").replace("]", " ").split(" -- ")[0].split()
        name = words[1].split("/")[0].split("|")[0]
        if name not in commands:
            if name.islower():
                wrong.append(f"{where}: {line}")
            continue
        known = {o for a in commands[name]._actions for o in a.option_strings}
        wrong += [
            f"{where}: {line} ({w})" for w in words[2:] if w.startswith("--") and w not in known
        ]
    assert wrong == []


def test_the_studies_the_pages_run_exist() -> None:
    """``python -m benchmarks NAME``, in a shell block or in backticks, names a
    study of ``benchmarks/studies`` (a placeholder is upper case)."""
    named = [
        (str(page.relative_to(ROOT)), name)
        for page in PAGES
        for name in re.findall(r"-m benchmarks ([A-Za-z_]+)", page.read_text())
    ]
    assert len(named) >= 10
    assert [(w, n) for w, n in named if n.islower() and n not in benchmarks.names()] == []
