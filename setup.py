"""Builds aiordma's optional compiled parts with Cython.

* The verbs driver core (``aiordma/verbs/_driver/_core.pyx``): completion
  queue drain and posting in C, over the handles of pyverbs' objects.
* The per-message modules listed in ``aiordma/_compiled.py``: plain typed
  Python compiled as they are (Cython's pure Python mode), so the ``.py``
  file is both the pure path and the source of the compiled one. Each
  extension gets a stamp with its source's SHA-256, so a stale build is
  passed over for its source (see ``aiordma/_compiled.py``).

Everything else is in pyproject.toml. All of it is optional: without a C
compiler, Cython or the verbs headers (libibverbs-dev), the build says why
and installs the pure-Python package, which does the same work more slowly
(``aiordma info`` names the path in use).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _compiled_module() -> ModuleType:
    """``aiordma/_compiled.py``, loaded by path (the package itself is not importable here)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aiordma", "_compiled.py")
    spec = importlib.util.spec_from_file_location("_aiordma_compiled", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMPILED = _compiled_module()
SOURCES = {name: name.replace(".", "/") + ".py" for name in COMPILED.MODULES}
DIRECTIVES = {
    "language_level": 3,
    # Annotations keep their Python meaning (a module's typed C code opts in
    # explicitly), so the compiled module behaves as its source does.
    "annotation_typing": False,
    "binding": True,
}


class OptionalBuildExt(build_ext):
    """build_ext that warns and carries on when a part cannot be built, and
    stamps each compiled module with its source's digest."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # any failure: fall back to pure Python
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # any failure: fall back to pure Python
            self._skip(exc)
            return
        self._stamp(ext.name, self.get_ext_fullpath(ext.name))

    def copy_extensions_to_source(self) -> None:
        """In-place builds (``pip install -e``) copy each extension beside its
        source; its stamp goes with it."""
        super().copy_extensions_to_source()
        for ext in self.extensions:
            source = SOURCES.get(ext.name)
            if source is not None:
                name = os.path.basename(self.get_ext_filename(ext.name))
                self._stamp(ext.name, os.path.join(os.path.dirname(source), name))

    @staticmethod
    def _stamp(name: str, extension: str) -> None:
        """Write, beside ``extension``, the digest of the source it was built from."""
        source = SOURCES.get(name)
        if source is not None and os.path.exists(extension):
            with open(extension + COMPILED.STAMP_SUFFIX, "w") as f:
                f.write(COMPILED.source_digest(source) + "\n")

    @staticmethod
    def _skip(exc: BaseException) -> None:
        print(
            f"aiordma: the compiled core was not built ({exc}); installing the "
            "pure-Python path. Install a C compiler, Cython and libibverbs-dev "
            "for the faster one.",
            file=sys.stderr,
        )


def extensions() -> list[Extension]:
    core = Extension(
        "aiordma.verbs._driver._core", ["aiordma/verbs/_driver/_core.pyx"], libraries=["ibverbs"]
    )
    modules = [Extension(name, [source]) for name, source in SOURCES.items()]
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("aiordma: Cython is not installed; pure-Python path only", file=sys.stderr)
        return []
    try:
        return list(
            cythonize([core, *modules], compiler_directives=DIRECTIVES, quiet=True, nthreads=2)
        )
    except Exception as exc:
        OptionalBuildExt._skip(exc)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
