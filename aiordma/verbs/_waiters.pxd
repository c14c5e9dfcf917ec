# C-level declarations of aiordma/verbs/_waiters.py (compiled in Cython's
# pure Python mode).

from aiordma.verbs._waiting cimport WaitPolicy

cdef class Waiter:
    cdef object _driver
    cdef object _loop
    cdef dict _handlers
    cdef object _report
    cdef int _budget
    cdef object _clock
    cdef bint _stopped
    cdef bint _drain_scheduled
    cdef readonly bint polls
    cdef readonly bint expects
    cpdef kick(self)
    cpdef expect(self)
    cpdef yield_drain(self)
    cpdef int drain(self) except? -1
    cdef int _drain_unarmed(self) except? -1

cdef class Sleeper(Waiter):
    pass

cdef class FixedWindow(Waiter):
    cdef double _window
    cdef bint _polling
    cdef double _poll_until
    cdef bint _hit
    cdef Py_ssize_t _hits
    cdef Py_ssize_t _misses
    cdef double _spun
    cdef int _settle(self, bint keep_polling) except? -1

cdef class AutoSpinner(Waiter):
    cdef readonly WaitPolicy policy
    cdef double _slice
    cdef public bint polling
    cdef readonly double spun
    cdef bint _expecting
    cdef double _spin_from
    cdef bint _late
    cdef bint _in_spin
    cdef bint _again
    cdef double _window
    cdef double _poll_until
    cdef object _received_before
    cdef _end_late(self, double waited)
