"""Which per-message modules run compiled (aiordma/_compiled.py): host tests."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import aiordma
from aiordma import _compiled

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _package(tmp_path: Path, stamp: str | None) -> str:
    """A package ``pkg`` with module ``mod``: its source, an extension file
    beside it, and the extension's stamp (None: no stamp)."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "mod.py").write_text("VALUE = 1\n")
    (root / f"mod{SUFFIX}").write_bytes(b"not loaded by plan()")
    if stamp is not None:
        (root / f"mod{SUFFIX}{_compiled.STAMP_SUFFIX}").write_text(stamp + "\n")
    return str(root)


def test_an_extension_built_from_this_source_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(_compiled.PURE_ENV, raising=False)
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "mod.py").write_text("VALUE = 1\n")
    digest = _compiled.source_digest(str(root / "mod.py"))
    (root / f"mod{SUFFIX}").write_bytes(b"")
    (root / f"mod{SUFFIX}{_compiled.STAMP_SUFFIX}").write_text(digest + "\n")
    assert _compiled.plan(str(root), ["pkg.mod"]) == ({}, ["pkg.mod"], [])


@pytest.mark.parametrize("stamp", [None, "0" * 64], ids=["no stamp", "other source"])
def test_a_stale_extension_is_passed_over_for_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stamp: str | None
) -> None:
    monkeypatch.delenv(_compiled.PURE_ENV, raising=False)
    root = _package(tmp_path, stamp)
    sources, built, stale = _compiled.plan(root, ["pkg.mod"])
    assert sources == {"pkg.mod": os.path.join(root, "mod.py")}
    assert (built, stale) == ([], ["pkg.mod"])


def test_one_stale_extension_sends_every_listed_module_to_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled modules cimport each other: one built from other source
    must not leave the others compiled against it."""
    monkeypatch.delenv(_compiled.PURE_ENV, raising=False)
    root = _package(tmp_path, "0" * 64)  # pkg.mod: stale
    fresh = Path(root) / "other.py"
    fresh.write_text("VALUE = 2\n")
    (Path(root) / f"other{SUFFIX}").write_bytes(b"")
    stamp = Path(root) / f"other{SUFFIX}{_compiled.STAMP_SUFFIX}"
    stamp.write_text(_compiled.source_digest(str(fresh)) + "\n")
    assert _compiled.plan(root, ["pkg.other"]) == ({}, ["pkg.other"], [])
    sources, built, stale = _compiled.plan(root, ["pkg.other", "pkg.mod"])
    assert sources == {"pkg.other": str(fresh), "pkg.mod": os.path.join(root, "mod.py")}
    assert (built, stale) == ([], ["pkg.mod"])


def test_forcing_pure_loads_the_source_of_a_fresh_extension(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "mod.py").write_text("VALUE = 1\n")
    (root / f"mod{SUFFIX}").write_bytes(b"")
    digest = _compiled.source_digest(str(root / "mod.py"))
    (root / f"mod{SUFFIX}{_compiled.STAMP_SUFFIX}").write_text(digest)
    monkeypatch.setenv(_compiled.PURE_ENV, "1")
    sources, built, stale = _compiled.plan(str(root), ["pkg.mod"])
    assert list(sources) == ["pkg.mod"]
    assert (built, stale) == ([], [])


def test_a_module_without_extension_is_left_to_the_normal_import(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "mod.py").write_text("VALUE = 1\n")
    assert _compiled.plan(str(root), ["pkg.mod"]) == ({}, [], [])


def _files_in_child(pure: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != _compiled.PURE_ENV}
    if pure is not None:
        env[_compiled.PURE_ENV] = pure
    code = (
        "import importlib, json, aiordma; from aiordma import _compiled; "
        "print(json.dumps({m: importlib.import_module(m).__file__ for m in _compiled.MODULES}))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return dict(json.loads(out))


def test_forced_pure_runs_every_per_message_module_from_source() -> None:
    if not _compiled.MODULES:
        pytest.skip("no per-message module is compiled yet")
    files = _files_in_child("1")
    assert sorted(files) == sorted(_compiled.MODULES)
    assert all(path.endswith(".py") for path in files.values()), files


def test_a_fresh_build_runs_every_per_message_module_compiled() -> None:
    if not _compiled.MODULES:
        pytest.skip("no per-message module is compiled yet")
    if _compiled.forced_pure():
        pytest.skip("the pure path is forced")
    # ./dev setup builds them (and ./dev test runs it first): CI must run them compiled.
    _, built, stale = _compiled.plan(os.path.dirname(aiordma.__file__ or ""))
    assert built == list(_compiled.MODULES), f"stale: {stale}; run ./dev setup"
    files = _files_in_child(None)
    assert all(path.endswith(SUFFIX) for path in files.values()), files


def test_the_source_finder_wins_over_the_extension_beside_it(tmp_path: Path) -> None:
    """End to end: an extension that cannot even load (garbage) is never
    tried once plan() says its module runs from source."""
    root = _package(tmp_path, None)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    code = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
try:
    import pkg.mod
except ImportError:
    print("extension tried")
else:
    raise SystemExit("the garbage extension loaded?")
sys.modules.pop("pkg.mod", None)
from aiordma import _compiled
sources, _, stale = _compiled.plan({root!r}, ["pkg.mod"])
sys.meta_path.insert(0, _compiled._SourceFinder(sources))
import pkg.mod
print(stale, pkg.mod.VALUE, pkg.mod.__file__.endswith("mod.py"))
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.split("\n")  # fmt: skip
    assert out[:2] == ["extension tried", "['pkg.mod'] 1 True"]


def test_a_changed_pxd_makes_the_build_stale(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("VALUE = 1\n")
    alone = _compiled.source_digest(str(tmp_path / "mod.py"))
    (tmp_path / "mod.pxd").write_text("cdef int x\n")
    with_pxd = _compiled.source_digest(str(tmp_path / "mod.py"))
    (tmp_path / "mod.pxd").write_text("cdef long x\n")
    assert len({alone, with_pxd, _compiled.source_digest(str(tmp_path / "mod.py"))}) == 3


def test_the_pure_path_run_tests_every_per_message_module() -> None:
    """``./dev test`` runs ``PURE_TESTS`` with ``AIORDMA_PURE=1``: it must
    hold the tests of every module that can run either way (tests mirror
    the package: ``aiordma/verbs/_lane.py`` is ``tests/verbs/test_lane.py``)."""
    root = Path(__file__).resolve().parent.parent
    dev = (root / "dev").read_text()
    listed = dev.split('PURE_TESTS="', 1)[1].split('"', 1)[0].split()
    assert all((root / path.split("::")[0]).exists() for path in listed), listed
    for module in _compiled.MODULES:
        *package, name = module.split(".")[1:]
        mirror = "/".join(["tests", *package, f"test_{name.lstrip('_')}.py"])
        assert mirror in listed, f"{module}: {mirror} is not in dev's PURE_TESTS"


def test_every_file_a_stamp_hashes_is_installed_with_the_package() -> None:
    """An installed package compares each extension's stamp with the digest
    of the installed ``.py`` and ``.pxd``: one left out of the package data
    makes every per-message module run interpreted (issue 41)."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parent.parent
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]["aiordma"]

    for module in _compiled.MODULES:
        pxd = root / (module.replace(".", "/") + ".pxd")
        if pxd.exists():
            relative = str(pxd.relative_to(root / "aiordma"))
            assert any(fnmatch.fnmatch(relative, glob) for glob in data), (
                f"{relative} is hashed by the stamp but not package data"
            )
