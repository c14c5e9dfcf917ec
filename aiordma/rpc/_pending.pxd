# C-level declarations of aiordma/rpc/_pending.py (compiled in Cython's pure
# Python mode).

from aiordma.rpc.frames cimport Frame

cdef class Call:
    cdef public str method
    cdef public object future
    cdef public object into
    cdef public object error
    cdef public double started

cdef class Pending:
    cdef object _loop
    cdef object _stats
    cdef unsigned long long _next_id
    cdef public dict calls
    cpdef object start(self, str method, object into)
    cpdef object take(self, object head)
