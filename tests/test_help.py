"""``help()`` on a settings value lists each field with its docstring (host only)."""

from __future__ import annotations

import dataclasses
import pydoc

import pytest

import aiordma
from aiordma._help import field_docs
from aiordma.cm.options import EndpointOptions

SETTINGS = [
    aiordma.ConnectOptions, aiordma.ServeOptions, EndpointOptions, aiordma.ChannelOptions,
    aiordma.QueuePairOptions,
]  # fmt: skip


@pytest.mark.parametrize("kind", SETTINGS, ids=lambda kind: kind.__name__)
def test_help_names_every_field_with_its_docstring(kind: type) -> None:
    """Issue 62: ``help(ConnectOptions)`` said nothing about each field."""
    docs: dict[str, str] = {}
    for klass in kind.__mro__:
        if dataclasses.is_dataclass(klass):
            docs = field_docs(klass) | docs
    text = pydoc.plain(pydoc.render_doc(kind))
    for field in dataclasses.fields(kind):
        assert docs.get(field.name), f"{kind.__name__}.{field.name} has no docstring"
        first_line = docs[field.name].splitlines()[0]
        assert f"{field.name}: " in text
        assert first_line in text, f"help({kind.__name__}) lacks {field.name}'s docstring"


def test_a_multi_line_docstring_keeps_its_lines() -> None:
    docs = field_docs(aiordma.ConnectOptions)
    assert docs["timeout"] == (
        "Seconds for the whole set-up (None or infinity: no bound; 0 or less:\nexpired already)."
    )
