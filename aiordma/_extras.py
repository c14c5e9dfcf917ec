"""The install hint of the optional integrations (``aiordma.dask``,
``aiordma.ray``): one message, naming what is missing and the pip extra
that installs it."""

from __future__ import annotations


def missing(feature: str, extra: str) -> ImportError:
    """The ImportError an integration raises when what it needs is not
    installed: ``feature`` says what it is and needs, then the pip command."""
    return ImportError(f"{feature}: pip install 'aiordma[{extra}]'")
