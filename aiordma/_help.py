"""Each settings field's docstring in ``help()``.

A field's docstring (the string under it in the class body) is what Sphinx
shows on the site, but Python keeps it nowhere at run time, and a slotted
dataclass's fields have no docstrings of their own: ``help(ConnectOptions)``
would say nothing about them. :func:`fields_in_help` reads the docstrings
from the class's source once, at import, and lists them in the generated
``__init__``'s docstring, which ``help()`` shows and the site leaves out
(autodoc documents a class by its own docstring).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import textwrap
from typing import TypeVar

T = TypeVar("T", bound=type)


@functools.cache
def _module_docs(path: str) -> dict[str, dict[str, str]]:
    """``{class: {field: docstring}}`` for the top-level classes of the module
    at ``path``, parsed once (empty if it cannot be read). A field's docstring
    is the string right after its annotated name."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError):
        return {}
    found: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs = found.setdefault(node.name, {})
        for field, after in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[field.target.id] = inspect.cleandoc(after.value.value)
    return found


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` for the fields declared in ``cls``'s own body
    (empty when its source cannot be read)."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if path is None or not path.endswith(".py"):
        return {}
    return dict(_module_docs(path).get(cls.__name__, {}))


def fields_in_help(cls: T) -> T:
    """Decorate a dataclass so that ``help(cls)`` lists each field, its type,
    default and docstring (from ``cls`` and its dataclass bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(field_docs(klass))
    entries = []
    for field in dataclasses.fields(cls):
        default = "" if field.default is dataclasses.MISSING else f" = {field.default!r}"
        doc = textwrap.indent(docs.get(field.name, ""), "    ")
        entries.append(f"{field.name}: {field.type}{default}\n{doc}".rstrip())
    init = cls.__dict__["__init__"]  # the one dataclass made for this class
    init.__doc__ = "Fields (each a keyword argument):\n\n" + "\n\n".join(entries)
    return cls
