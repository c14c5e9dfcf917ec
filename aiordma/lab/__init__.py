"""The rxe lab: make Soft-RoCE devices, or boot a guest that has one.

None of this is needed to use aiordma on a host with RDMA hardware; it exists
so that every developer, CI run and curious user can get a real RDMA device.
"""
