"""The compiled driver's stub, its protocols and the compiled classes name the
same members with the same parameters (no device needed).

The driver interface is stated in ``_driver/base.py`` (Protocols), in the
stub ``_core.pyi`` (what mypy sees of the compiled module) and in
``_core.pyx`` itself: a method added to one and not the others fails here,
not in a user's process.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

DRIVER = Path(__file__).resolve().parents[2] / "aiordma" / "verbs" / "_driver"
CLASSES = ("CQDriver", "QPDriver", "SRQDriver")


def _members(path: Path) -> dict[str, dict[str, tuple[str, ...] | None]]:
    """Per class of ``CLASSES``: member name -> its parameters (None: an attribute)."""
    tree = ast.parse(path.read_text())
    found: dict[str, dict[str, tuple[str, ...] | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in CLASSES:
            members: dict[str, tuple[str, ...] | None] = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name != "__init__":
                    params = [*item.args.posonlyargs, *item.args.args, *item.args.kwonlyargs]
                    members[item.name] = tuple(a.arg for a in params)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members[item.target.id] = None
            found[node.name] = members
    return found


def test_the_stub_states_what_the_protocols_state() -> None:
    protocols, stub = _members(DRIVER / "base.py"), _members(DRIVER / "_core.pyi")
    for name in CLASSES:
        wanted = protocols[name]
        missing = sorted(set(wanted) - set(stub[name]))
        assert not missing, f"_core.pyi's {name} lacks {missing}"
        for member, params in wanted.items():
            assert stub[name][member] == params, f"{name}.{member}: stub and protocol differ"


def test_the_compiled_classes_have_every_member_of_their_protocols() -> None:
    core = pytest.importorskip("aiordma.verbs._driver._core")
    protocols = _members(DRIVER / "base.py")
    for name in CLASSES:
        cls = getattr(core, name)
        missing = sorted(m for m in protocols[name] if not hasattr(cls, m))
        assert not missing, f"the compiled {name} lacks {missing}"
        for member, params in protocols[name].items():
            if params is None:
                continue
            try:
                signature = inspect.signature(getattr(cls, member))
            except (TypeError, ValueError):  # no signature kept for this method
                continue
            assert tuple(signature.parameters) == params, f"compiled {name}.{member}"
