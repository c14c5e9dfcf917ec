# C-level declarations of aiordma/verbs/_waiting.py (compiled in Cython's
# pure Python mode).

cdef class WaitPolicy:
    cdef double _cap
    cdef double _start
    cdef bint _enabled
    cdef double _mean
    cdef double _share
    cdef int _backoff
    cdef long long _skip
    cdef double _current
    cdef public double limit
    cdef public double window
    cdef public long long spins
    cdef public long long hits
    cdef public long long misses
    cdef public long long skipped
    cdef public long long late
    cpdef double start(self)
    cpdef hit(self, double waited)
    cpdef miss(self)
    cpdef answered(self, double waited)
