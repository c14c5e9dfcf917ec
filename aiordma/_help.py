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

import dataclasses
import inspect
import re
import sys
import textwrap
from typing import TypeVar

T = TypeVar("T", bound=type)

_FIELD = re.compile(r"^(\s+)(\w+)\s*:")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` for the fields declared in ``cls``'s own body
    (empty when its source cannot be read)."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if path is None or not path.endswith(".py"):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    header = re.compile(rf"class {cls.__name__}\b")
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return {}
    docs: dict[str, str] = {}
    i = start + 1
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace():
            break  # the class body ended
        match = _FIELD.match(line)
        quote = lines[i + 1].strip()[:3] if i + 1 < len(lines) else ""
        if match and quote in ('"""', "'''"):
            body, j = [lines[i + 1].strip()[3:]], i + 1
            while quote not in body[-1]:
                j += 1
                body.append(lines[j])
            body[-1] = body[-1][: body[-1].index(quote)]
            docs[match.group(2)] = inspect.cleandoc("\n".join(body))
            i = j
        i += 1
    return docs


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
