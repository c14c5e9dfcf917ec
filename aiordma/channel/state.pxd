# C-level declarations of aiordma/channel/state.py (compiled in Cython's pure
# Python mode).

from aiordma.channel.credits cimport CreditWindow, DataCredits
from aiordma.channel.wire cimport Header, WireCodes

cdef class ChannelState:
    cdef public DataCredits data
    cdef public CreditWindow control
    cdef readonly int buffers
    cdef readonly int send_slots
    cdef public list free_slots
    cdef public bint said_hello
    cdef public bint failed
    cdef public object peer_max_message
    cdef public object ring_in
    cdef public object ring_out
    cpdef object arrived(self, Header header)
    cpdef bint emptied(self) except *
    cpdef object send(self, object kind, unsigned long long msg_id=*,
                      unsigned long long length=*, object remote=*, int head_length=*)
    cpdef bint update_due(self) except *
    cpdef object update(self)
    cpdef sent(self, int slot)
    cdef unsigned long long _apply(self, Header header) except? 0
