# C-level declarations of aiordma/rpc/frames.py (compiled in Cython's pure
# Python mode).

cdef class Frame:
    cdef readonly object kind
    cdef readonly unsigned long long call_id
    cdef readonly str method
