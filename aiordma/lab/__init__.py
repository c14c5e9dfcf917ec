"""The rxe lab: find RDMA devices, make Soft-RoCE ones, or boot a guest that has one.

None of this is needed to use aiordma on a host with RDMA hardware; it exists
so that every developer, CI run and curious user can get a real RDMA device.
"""

from aiordma.lab.devices import Device, Gid, Port, find_roce_endpoint, list_devices

__all__ = ["Device", "Gid", "Port", "find_roce_endpoint", "list_devices"]
