# C-level declarations of aiordma/rpc/_calls.py (compiled in Cython's pure
# Python mode).

from aiordma.rpc.frames cimport Frame

cdef class Calls:
    cdef object _run
    cdef Py_ssize_t _max_concurrency
    cdef Py_ssize_t _max_held
    cdef public object channel
    cdef public object stats
    cdef object _loop
    cdef dict _running
    cdef dict _holding
    cdef Py_ssize_t _requests
    cdef Py_ssize_t _results
    cdef object _freed
    cdef public set sending
    cdef public bint held_large
    cpdef bint on_message(self, object head, object body)
    cpdef dispatch(self, Frame frame, object body)
    cpdef hold_result(self, unsigned long long call_id, Py_ssize_t size)
    cpdef handled(self, double started)
    cdef _release(self, unsigned long long call_id)
    cdef bint _full(self, Py_ssize_t size)
