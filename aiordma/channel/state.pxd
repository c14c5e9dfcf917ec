# C-level declarations of aiordma/channel/state.py (compiled in Cython's pure
# Python mode).

from aiordma.channel.credits cimport CreditWindow, DataCredits
from aiordma.channel.wire cimport Header, WireCodes

cdef class Arrival:
    cdef public int slot
    cdef public Header header
    cdef public Py_ssize_t size
    cdef public object saved
    cdef public bint revoked
    cdef public bint reading
    cdef public bint acked
    cdef public object pieces
    cdef public long long missing
    cdef public object taken

cdef class ChannelState:
    cdef public DataCredits data
    cdef public CreditWindow control
    cdef readonly int buffers
    cdef readonly int send_slots
    cdef public list free_slots
    cdef public bint said_hello
    cdef public bint failed
    cdef public object ready
    cdef public Arrival filling
    cdef public list acks_due
    cdef public object peer_max_message
    cpdef object arrived(self, int slot, Header header, Py_ssize_t size)
    cpdef object take(self)
    cpdef bint piece_taken(self) except *
    cpdef object send(self, object kind, unsigned long long msg_id=*,
                      unsigned long long length=*, object remote=*, int head_length=*)
    cpdef bint update_due(self) except *
    cpdef object update(self)
    cpdef sent(self, int slot)
    cdef unsigned long long _apply(self, Header header) except? 0
    cdef _ack(self, Arrival arrival)
