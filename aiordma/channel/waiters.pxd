# C-level declarations of aiordma/channel/waiters.py (compiled in Cython's
# pure Python mode).

cdef class Waiters:
    cdef object _loop
    cdef readonly list changes
    cdef readonly list receiving
    cpdef object changed(self)
    cpdef object arrivals(self)
    cpdef wake(self, bint receiving)
