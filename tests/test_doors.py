"""The applications reach lower layers only through the channel layer's doors (no device).

The import contracts in ``pyproject.toml`` see imports, not attribute
chains: an application holding a channel could still walk down to its
queue pair (``channel.conn.qp``) or fish the channel out of a connection
(``conn.prepared``) with no import showing it. This test reads the
applications' source and refuses both, and any import of a channel
submodule instead of :mod:`aiordma.channel` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import aiordma

PACKAGE = Path(aiordma.__file__).parent
APPLICATIONS = ("rpc", "dask", "ray", "transfer", "streams.py", "prometheus.py")
"""Layer 4: what takes connections, memory and one-sided work from the
channel layer's public names."""
CORRIDORS = {("conn", "qp"), ("link", "qp")}
"""``x.conn.qp`` and ``x.link.qp``: a queue pair reached through a channel."""


def corridors(source: str) -> list[str]:
    """Where ``source`` reaches past the channel layer's doors, one line each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            inner = node.value
            if isinstance(inner, ast.Attribute) and (inner.attr, node.attr) in CORRIDORS:
                found.append(f"{node.lineno}: .{inner.attr}.{node.attr}")
            elif node.attr == "prepared":
                found.append(f"{node.lineno}: .prepared (use aiordma.channel.channel_of)")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("aiordma.channel."):
                found.append(f"{node.lineno}: from {node.module} import ...")
            if node.module == "aiordma.channel":
                found += [f"{node.lineno}: aiordma.channel.{alias.name}" for alias in node.names
                          if alias.name[0].islower() and alias.name in _SUBMODULES]  # fmt: skip
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name.startswith("aiordma.channel.")]  # fmt: skip
    return sorted(found, key=lambda line: int(line.split(":")[0]))


_SUBMODULES = {path.stem for path in (PACKAGE / "channel").glob("*.py")} - {"__init__"}


def application_sources() -> list[Path]:
    paths: list[Path] = []
    for name in APPLICATIONS:
        place = PACKAGE / name
        paths += sorted(place.rglob("*.py")) if place.is_dir() else [place]
    return paths


def test_the_applications_use_only_the_channel_layers_doors() -> None:
    sources = application_sources()
    assert len(sources) > 10  # the walk found the packages
    reaches = {
        str(path.relative_to(PACKAGE)): found
        for path in sources
        if (found := corridors(path.read_text()))
    }
    assert reaches == {}


def test_the_check_sees_each_kind_of_corridor() -> None:
    source = """
from aiordma.channel.buffers import Into
from aiordma.channel import rendezvous, open_channel
import aiordma.channel.rendezvous
run = channel.conn.qp.start_bulk()
loop = channel.link.qp.loop
chan = conn.prepared
fine = channel.conn.peer_address
"""
    assert corridors(source) == [
        "2: from aiordma.channel.buffers import ...",
        "3: aiordma.channel.rendezvous",
        "4: import aiordma.channel.rendezvous",
        "5: .conn.qp",
        "6: .link.qp",
        "7: .prepared (use aiordma.channel.channel_of)",
    ]
