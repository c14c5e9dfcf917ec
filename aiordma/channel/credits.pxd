# C-level declarations of aiordma/channel/credits.py (compiled in Cython's pure
# Python mode): what other compiled modules call without Python in between.

cdef class CreditWindow:
    cdef readonly int window
    cdef public int available
    cdef public int limit
    cdef public int owed
    cdef int _owed_by_data
    cpdef bint can_send_data(self) except *
    cpdef int take_for_data(self) except *
    cpdef bint should_send_update(self) except *
    cpdef int take_for_update(self) except *
    cdef int _piggyback(self)
    cpdef int piggyback(self) except *
    cpdef granted(self, int credits)
    cpdef reposted(self, bint for_data)

cdef class DataCredits:
    cdef readonly int window
    cdef public int available
    cdef public int limit
    cdef public int owed
    cpdef bint can_send(self) except *
    cpdef take(self)
    cpdef bint should_send_update(self) except *
    cpdef int piggyback(self) except *
    cpdef granted(self, int credits)
    cpdef arrived(self, bint last=*)
    cpdef reposted(self)

cdef class SharedDataCredits(DataCredits):
    cdef readonly object pool
    cdef readonly int base
    cdef public int tokens
    cdef public int held
    cdef public int share
