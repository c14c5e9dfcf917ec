"""What a typed per-message module needs of ``cython`` when Cython is absent.

Modules compiled in Cython's pure Python mode (see :mod:`aiordma._compiled`)
import ``cython`` for their type declarations; compiled, those declarations
become C types, and interpreted they must mean nothing. Cython ships such a
stand-in, but Cython is only a build requirement, so the pure-Python path
(an install without a compiler) uses this one:

    if TYPE_CHECKING:
        from aiordma import _cython_shim as cython
    else:
        try:
            import cython
        except ImportError:
            from aiordma import _cython_shim as cython

Only what aiordma's typed modules use is here; each is the plain-Python
meaning of its Cython counterpart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F")
T = TypeVar("T")

compiled = False
"""Whether the module runs compiled (never, here)."""

int = int  # C int, compiled
bint = bool
longlong = int
ulonglong = int
uint = int
Py_ssize_t = int
double = float


def cclass(cls: F) -> F:
    """An extension type, compiled; a class, interpreted."""
    return cls


def ccall(func: F) -> F:
    """A method callable from C and Python alike, compiled (``cpdef``)."""
    return func


def cfunc(func: F) -> F:
    """A C function, compiled (``cdef``)."""
    return func


def inline(func: F) -> F:
    return func


def final(cls: F) -> F:
    return cls


def exceptval(_value: Any = None, *, check: bool = True) -> Callable[[F], F]:
    """The value a C function returns when it raised, compiled."""
    return lambda func: func


def locals(**_types: Any) -> Callable[[F], F]:
    """Typed locals, compiled."""
    return lambda func: func


def declare(kind: type[T], value: Any = None, **_options: Any) -> T:
    """A typed variable or attribute declaration, compiled; its value
    (None for an attribute, which ``__init__`` sets), interpreted."""
    return value  # type: ignore[no-any-return]
