"""Which per-message modules run compiled: decided once, before any is imported.

The modules in :data:`MODULES` are typed Python that ``setup.py`` also
compiles with Cython (pure Python mode: the ``.py`` file is the only
source) into extension modules of the same name, which Python's import
system prefers to the source beside them. :func:`install` (run when
``aiordma/__init__.py`` imports this module, before anything else) puts a
finder ahead of the others that sends each of these names to its source
instead when

* ``AIORDMA_PURE=1`` is set (comparison, debugging, CI's pure-path run), or
* any of their extensions was built from another version of the source
  (a development tree edited since ``./dev setup``): the build writes the
  SHA-256 of the source (the ``.py`` and its ``.pxd``) beside each
  extension (``<extension>.source``). One stale module sends them all to
  their source, since compiled modules use each other's C declarations
  (``cimport``), which a module run from source does not have.

The verbs driver core (``aiordma/verbs/_driver/_core.pyx``, C with no pure
twin) is decided here too, by :func:`load_core`, under the same
``AIORDMA_PURE``. Nothing else in the package asks which way a module runs:
the two are the same code. This module imports nothing of the package (``setup.py`` loads
it by path to learn :data:`MODULES`).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Final

PURE_ENV: Final = "AIORDMA_PURE"
"""Set to 1 to force the pure-Python path (for comparison or debugging)."""

MODULES: Final[tuple[str, ...]] = (
    "aiordma._histogram",
    "aiordma._loop_check",
    "aiordma.bulk_table",
    "aiordma.channel.wire",
    "aiordma.channel.credits",
    "aiordma.channel.waiters",
    "aiordma.channel.state",
    "aiordma.channel.inbox",
    "aiordma.channel.packets",
    "aiordma.channel.outbox",
    "aiordma.verbs._room",
    "aiordma.verbs._waiting",
    "aiordma.verbs._waiters",
    "aiordma.verbs._completed",
    "aiordma.verbs._work",
    "aiordma.verbs._engine",
    "aiordma.verbs._lane",
    "aiordma.verbs._bulk",
    "aiordma.rpc.frames",
    "aiordma.rpc._pending",
    "aiordma.rpc._calls",
    "aiordma.transfer._plan",
)
"""The modules on the per-message path, compiled when the build could.

Only modules whose hot code is typed for Cython belong here: compiling
untyped Python gains about a seventh on a host and is slower than the
interpreter in the lab's emulated guests (docs/decisions/0006); and
modules whose C declarations the others share (``bulk_table``'s layout).
"""

STAMP_SUFFIX: Final = ".source"
"""Beside each extension: the SHA-256 (hex) of the source it was built from."""


def load_core(name: str, abi: int, rebuild: str) -> tuple[ModuleType | None, str]:
    """The compiled driver core ``name`` if it is to run (not forced pure,
    built, and of interface version ``abi``; ``rebuild`` says how to mend a
    stale one), and a line saying which path runs and why. Imported by
    name: this module imports nothing of the package at import time."""
    if forced_pure():
        return None, f"pure Python (forced by {PURE_ENV})"
    try:
        core = importlib.import_module(name)
    except ImportError as exc:
        return None, f"pure Python (the compiled core is not built: {exc})"
    if getattr(core, "ABI", None) != abi:
        return None, f"pure Python (the compiled core is stale: {rebuild})"
    return core, f"compiled ({name})"


def forced_pure() -> bool:
    """Whether ``AIORDMA_PURE`` asks for the pure-Python path."""
    return os.environ.get(PURE_ENV, "").strip() not in ("", "0")


def source_digest(path: str) -> str:
    """The SHA-256 (hex) of the module whose source is ``path`` (a ``.py``
    file, and the ``.pxd`` beside it if there is one), as the build stamps it."""
    digest = hashlib.sha256()
    for part in (path, os.path.splitext(path)[0] + ".pxd"):
        if part == path or os.path.exists(part):
            with open(part, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _extension(stem: str) -> str | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.exists(stem + suffix):
            return stem + suffix
    return None


class _SourceFinder:
    """Finds the listed modules as source, ahead of the extension beside them."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources = sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


compiled: tuple[str, ...] = ()
"""The listed modules that run compiled (set by :func:`install`)."""
stale: tuple[str, ...] = ()
"""Listed modules with an extension built from other source, which run from source."""


def plan(
    root: str, modules: Sequence[str] = MODULES
) -> tuple[dict[str, str], list[str], list[str]]:
    """For the package whose directory is ``root``: the listed modules to
    load from source (name to file), those that run compiled, and those
    whose extension is stale (if any is, none runs compiled)."""
    parent = os.path.dirname(root)
    found: dict[str, str] = {}
    old: list[str] = []
    for name in modules:
        stem = os.path.join(parent, *name.split("."))
        extension = _extension(stem)
        source = stem + ".py"
        if extension is None or not os.path.exists(source):
            continue  # the normal import finds the one there is
        found[name] = source
        try:
            with open(extension + STAMP_SUFFIX) as f:
                fresh = f.read().strip() == source_digest(source)
        except OSError:
            fresh = False
        if not fresh:
            old.append(name)
    # One stale module sends them all to source: the others may cimport it.
    if forced_pure() or old:
        return found, [], old
    return {}, list(found), old


def install(root: str) -> None:
    """Make the import system load the listed modules of the package whose
    directory is ``root`` as :func:`plan` says (once, when this module is
    imported: before any of them is)."""
    global compiled, stale
    sources, built, old = plan(root)
    compiled, stale = tuple(built), tuple(old)
    if sources:
        sys.meta_path.insert(0, _SourceFinder(sources))


if __name__ == "aiordma._compiled":  # not when setup.py loads this file by path
    install(os.path.dirname(os.path.abspath(__file__)))
elif __name__ == "__main__":  # scripts/bootstrap: the sources a build depends on
    stems = [name.replace(".", "/") for name in MODULES]
    print(" ".join(s + ext for s in stems for ext in (".py", ".pxd") if os.path.exists(s + ext)))
