"""Dask on RDMA: the ``rdma://`` comm backend for dask.distributed.

Install ``aiordma[dask]``; distributed then finds the backend through its
``distributed.comm.backends`` entry point, and ``rdma://`` addresses work
wherever ``tcp://`` ones do::

    dask scheduler --protocol rdma --host 192.0.2.1
    dask worker rdma://192.0.2.1:8786
    Client("rdma://192.0.2.1:8786")

See ``docs/guides/dask.md``.
"""

from aiordma._extras import missing

try:
    import distributed  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    what = "aiordma.dask is the rdma:// backend for dask.distributed, which is not installed"
    raise missing(what, "dask") from exc

from aiordma.dask.backend import RdmaBackend
from aiordma.dask.comm import RdmaComm, RdmaConnector, RdmaListener

__all__ = ["RdmaBackend", "RdmaComm", "RdmaConnector", "RdmaListener"]
