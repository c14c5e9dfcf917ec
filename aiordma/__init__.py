"""aiordma: asyncio-native RDMA on pyverbs."""

from __future__ import annotations

from aiordma import _pyverbs  # noqa: F401  (fails early, with install instructions)
from aiordma.exceptions import RdmaError

__all__ = ["RdmaError"]
__version__ = "0.1.0.dev0"
