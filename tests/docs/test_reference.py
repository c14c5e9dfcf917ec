"""Every public name has a docstring and a place in the API reference (no device needed)."""

from __future__ import annotations

import ast
import inspect
import itertools
import re
from pathlib import Path
from types import ModuleType

import pytest

import aiordma
import aiordma.dask
import aiordma.ray
import aiordma.transfer
from aiordma import rpc

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"
PACKAGES = {
    "aiordma": aiordma,
    "aiordma.rpc": rpc,
    "aiordma.dask": aiordma.dask,
    "aiordma.ray": aiordma.ray,
    "aiordma.transfer": aiordma.transfer,
}


def _public(module: ModuleType) -> list[tuple[str, object]]:
    return [(name, getattr(module, name)) for name in module.__all__]


def _alias_docstring(obj_module: str, name: str) -> str | None:
    """The docstring under a module-level assignment (how type aliases are documented)."""
    module = __import__(obj_module, fromlist=["_"])
    # A compiled module's source is the .py beside it (aiordma/_compiled.py).
    path = Path(module.__file__ or "")
    body = ast.parse(path.with_name(path.name.split(".")[0] + ".py").read_text()).body
    for node, following in itertools.pairwise(body):
        targets = node.targets if isinstance(node, ast.Assign) else []
        named = any(isinstance(t, ast.Name) and t.id == name for t in targets)
        if named and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            return str(following.value.value)
    return None


def _documented_names() -> set[str]:
    names: set[str] = set()
    for page in REFERENCE.glob("*.rst"):
        text = page.read_text()
        module = "aiordma"
        for line in text.splitlines():
            if m := re.match(r"\.\. (?:currentmodule|automodule):: (\S+)", line):
                module = m.group(1)
            elif m := re.match(r"\.\. (?:auto)?(?:class|function|exception|data):: (\S+)", line):
                target = m.group(1)
                names.add(target if target.startswith("aiordma.") else f"{module}.{target}")
    return names


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_public_name_is_in_the_reference(package: str) -> None:
    documented = _documented_names()
    missing = [
        name for name, _ in _public(PACKAGES[package]) if f"{package}.{name}" not in documented
    ]
    assert missing == []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_public_name_has_a_docstring(package: str) -> None:
    undocumented = []
    for name, obj in _public(PACKAGES[package]):
        if inspect.isclass(obj) or inspect.isroutine(obj):
            if not inspect.getdoc(obj):
                undocumented.append(name)
        elif not any(_alias_docstring(m, name) for m in _defining_modules(package)):
            undocumented.append(name)
    assert undocumented == []


def _defining_modules(package: str) -> list[str]:
    root = Path(PACKAGES[package].__file__ or "").parent
    modules = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts[-1] != "__main__":
            modules.append(".".join((package, *parts)))
    return modules


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_public_methods_and_properties_have_docstrings(package: str) -> None:
    undocumented = []
    for name, obj in _public(PACKAGES[package]):
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            func = value.fget if isinstance(value, property) else value
            if isinstance(func, classmethod | staticmethod):
                func = func.__func__
            if inspect.isroutine(func) and not func.__doc__:
                undocumented.append(f"{name}.{attr}")
    assert undocumented == []
