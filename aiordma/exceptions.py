"""Exception hierarchy shared by every aiordma layer."""

from __future__ import annotations


class RdmaError(Exception):
    """Base class of every error aiordma raises on its own account."""


class LabError(RdmaError):
    """The lab could not provide a real RDMA device."""
