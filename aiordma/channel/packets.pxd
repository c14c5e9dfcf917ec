# C-level declarations of aiordma/channel/packets.py (compiled in Cython's
# pure Python mode).

from aiordma.channel.inbox cimport Arrival, Inbox
from aiordma.channel.state cimport ChannelState
from aiordma.channel.waiters cimport Waiters
from aiordma.channel.wire cimport Header, WireCodes, read_packet, write_packet

cdef class Packets:
    cdef readonly ChannelState state
    cdef readonly Inbox inbox
    cdef readonly object lane
    cdef readonly Py_ssize_t size
    cdef readonly object send_view
    cdef readonly unsigned long long max_message
    cdef readonly Py_ssize_t eager_limit
    cdef public object deliver
    cdef readonly bint failed
    cdef readonly int senders
    cdef readonly int receivers
    cdef readonly bint room_pending
    cdef readonly Waiters waiting
    cdef object _report
    cdef object _stats
    cdef object _shared
    cdef object _loop
    cpdef turn(self, bint send, int step)
    cpdef post(self, int slot, Header header, object head, object body)
    cpdef int try_send(self, object kind, unsigned long long msg_id, unsigned long long length,
                       object remote, object head, object body) except? -1
    cpdef hold(self)
    cpdef flush(self)
    cpdef sent(self, int slot)
    cpdef arrived(self, int slot, Py_ssize_t size)
    cdef bint _all_delivered(self, Py_ssize_t count) except *
    cdef bint _delivered(self, Arrival arrival) except *
    cpdef Arrival eager_first(self)
    cpdef bint needs_turn(self) except *
    cpdef object take_eager(self, object into)
    cpdef list take_eagers(self, Py_ssize_t limit)
    cpdef Py_ssize_t take_medium(self, object into) except? -2
    cpdef Py_ssize_t take_pieces(self, Arrival arrival, object target, Py_ssize_t offset)
    cpdef bint repost(self, int slot) except *
    cpdef consumed(self)
    cdef _take_first(self, bint count)
    cdef bint _give_back(self) except *
    cdef _add(self, str name)
    cdef _count_received(self, Header header)
    cpdef pump(self)
    cdef _update(self)
    cpdef wake(self)
