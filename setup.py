"""Builds aiordma's optional compiled core (aiordma/verbs/_driver/_core.pyx).

Everything else is in pyproject.toml. The extension is optional: without a
C compiler, Cython or the verbs headers (libibverbs-dev), the build says
why and installs the pure-Python package, which does the same work more
slowly (``aiordma devices`` names the path in use).
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns and carries on when the core cannot be built."""

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
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("aiordma: Cython is not installed; pure-Python path only", file=sys.stderr)
        return []
    try:
        return list(cythonize([core], language_level=3, quiet=True))
    except Exception as exc:
        OptionalBuildExt._skip(exc)
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
