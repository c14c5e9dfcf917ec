"""Dask on RDMA: the ``rdma://`` comm backend for dask.distributed.

Install ``aiordma[dask]``; distributed then finds the backend through its
``distributed.comm.backends`` entry point, and ``rdma://`` addresses work
wherever ``tcp://`` ones do::

    dask scheduler --protocol rdma --host 192.0.2.1
    dask worker rdma://192.0.2.1:8786
    Client("rdma://192.0.2.1:8786")

See ``docs/guides/dask.md``.
"""

from aiordma.dask.backend import RdmaBackend
from aiordma.dask.comm import RdmaComm, RdmaConnector, RdmaListener

__all__ = ["RdmaBackend", "RdmaComm", "RdmaConnector", "RdmaListener"]
