# C-level declarations of aiordma/verbs/_room.py (compiled in Cython's pure
# Python mode): what the packet lane calls without Python in between.

cdef class QueueRoom:
    cdef readonly int size
    cdef public int free
    cdef object _waiters
    cdef object _failure
    cdef object _failure_tb
    cpdef bint try_acquire(self, int n) except *
    cpdef bint can_acquire(self, int n) except *
    cpdef release(self, int n=*)
    cdef _wake(self)
