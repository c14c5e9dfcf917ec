# C-level declarations of aiordma/verbs/_spinner.py (compiled in Cython's
# pure Python mode).

from aiordma.verbs._waiting cimport WaitPolicy

cdef class Spinner:
    cdef readonly WaitPolicy policy
    cdef object _driver
    cdef object _loop
    cdef object _fd
    cdef dict _handlers
    cdef object _report
    cdef int _budget
    cdef object _yield_drain
    cdef double _slice
    cdef public bint polling
    cdef readonly double spun
    cdef bint _stopped
    cdef bint _expecting
    cdef double _spin_from
    cdef bint _late
    cdef bint _in_spin
    cdef bint _again
    cdef double _window
    cdef double _poll_until
    cdef object _received_before
    cpdef expect(self)
    cdef _drain(self)
    cdef _end_late(self, double waited)
