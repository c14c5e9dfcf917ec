"""Import guard for pyverbs, rdma-core's Python bindings.

pyverbs is not a pip dependency (see pyproject.toml): it comes from the
distribution. Everything in aiordma that talks to verbs imports it through
here so a missing install produces one clear, actionable error.
"""

from __future__ import annotations

INSTALL_HINT = (
    "aiordma needs pyverbs, rdma-core's Python bindings. Install the distribution "
    "package (Debian/Ubuntu/Fedora: 'python3-pyverbs') and create your virtualenv "
    "from the system interpreter with '/usr/bin/python3 -m venv --system-site-packages', "
    "or run './dev setup' in an aiordma checkout. Building PyPI's 'pyverbs' sdist "
    "(all of rdma-core, needs cmake and cython) is the alternative."
)

try:
    import pyverbs  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without pyverbs
    raise ImportError(INSTALL_HINT) from exc
