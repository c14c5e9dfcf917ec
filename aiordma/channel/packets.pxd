# C-level declarations of aiordma/channel/packets.py (compiled in Cython's
# pure Python mode), and the copies between Python bytes and the channel's
# slots that only compiled code makes.

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.memoryview cimport PyMemoryView_GET_BUFFER
from libc.string cimport memcpy

from aiordma.channel.state cimport Arrival, ChannelState
from aiordma.channel.wire cimport Header, WireCodes, address_of, load_header, store_header

cdef class Packets:
    cdef readonly ChannelState state
    cdef readonly object lane
    cdef readonly Py_ssize_t size
    cdef readonly object send_view
    cdef readonly object recv_view
    cdef readonly bint recv_open
    cdef readonly unsigned long long max_message
    cdef readonly Py_ssize_t eager_limit
    cdef readonly object deliver
    cdef readonly bint failed
    cdef readonly int senders
    cdef readonly int receivers
    cdef readonly bint room_pending
    cdef list waiters
    cdef list receiving
    cdef object _report
    cdef object _stats
    cdef object _shared
    cdef object _loop
    cdef Arrival _sink
    cdef object _sink_target
    cdef Py_ssize_t _sink_offset
    cpdef turn(self, bint send, int step)
    cpdef post(self, int slot, Header header, object head, object body)
    cpdef int try_send(self, object kind, unsigned long long msg_id, unsigned long long length,
                       object remote, object head, object body) except? -1
    cpdef bint send_eager(self, object head, object body, Py_ssize_t size) except *
    cpdef Py_ssize_t send_eagers(self, object bodies, object sizes, Py_ssize_t start, bint in_turn)
    cpdef Py_ssize_t send_medium(self, object head, object view, Py_ssize_t size)
    cpdef Py_ssize_t send_pieces(self, object view, Py_ssize_t offset, Py_ssize_t size)
    cdef Py_ssize_t _pieces(self, object view, Py_ssize_t offset, Py_ssize_t size) except? -1
    cdef _flush(self)
    cpdef sent(self, int slot)
    cpdef arrived(self, int slot, Py_ssize_t size)
    cpdef bint needs_turn(self) except *
    cpdef pump(self)
    cpdef wake(self)
    cpdef object changed(self)
    cpdef object arrivals(self)
    cdef _take_first(self)
    cdef _update(self)
    cdef _wake(self, bint receiving)
    cpdef Py_ssize_t take_pieces(self, Arrival arrival, object target, Py_ssize_t offset)
    cdef Py_ssize_t _copy_pieces(self, Arrival arrival, object target, Py_ssize_t offset) except? -1
    cdef Py_ssize_t _first_packet(self, Arrival arrival, object target) except? -1
    cpdef bint repost(self, int slot) except *
    cpdef consumed(self)
    cpdef object take_eager(self, object into)
    cpdef list take_eagers(self, Py_ssize_t limit)
    cpdef Py_ssize_t take_medium(self, object into) except? -2
    cpdef bytes head(self, Arrival arrival)
    cpdef object small_body(self, Arrival arrival, object into)
    cdef _count(self, str name, str amount_name, Py_ssize_t amount)
    cdef _add(self, str name)
    cpdef count_received(self, Header header)
    cdef Py_ssize_t _split(self, int slot, Header header, Py_ssize_t start) except? -1
    cdef bint _all_delivered(self, Py_ssize_t count) except *
    cdef bint _delivered(self, Arrival arrival) except *


cdef inline Py_ssize_t byte_size(object data) noexcept:
    """Bytes in ``data``, which :func:`address_of` knows."""
    if type(data) is memoryview:
        return PyMemoryView_GET_BUFFER(data).len
    return len(data)


cdef inline Py_ssize_t copy_in(object view, Py_ssize_t offset, object data,
                               Py_ssize_t room) except -2:
    """Copy ``data`` to ``view[offset:]`` and return its length, if it is
    memory :func:`address_of` knows and fits in ``room`` bytes; -1 if not."""
    cdef const unsigned char *source = address_of(data, False)
    cdef Py_ssize_t n
    if source == NULL:
        return -1
    n = byte_size(data)
    if n > room:
        return -1
    memcpy(address_of(view, True) + offset, source, n)
    return n


cdef inline object copy_out(object view, Py_ssize_t offset, Py_ssize_t n, object into):
    """``n`` bytes of ``view`` from ``offset``: a new bytes (``into`` None),
    or their count once copied to the start of ``into`` (a bytearray or
    writable memoryview of at least ``n`` bytes); None for another ``into``."""
    cdef const unsigned char *source = address_of(view, False) + offset
    cdef unsigned char *target
    if into is None:
        return PyBytes_FromStringAndSize(<const char *>source, n)
    if byte_size(into) < n:
        return None
    target = address_of(into, True)
    if target == NULL:
        return None
    memcpy(target, source, n)
    return n


cdef inline bint copy_within(object target, Py_ssize_t offset, object source, Py_ssize_t start,
                             Py_ssize_t n) except -1:
    """Copy ``n`` bytes of ``source`` from ``start`` to ``target`` at ``offset``,
    if both are memory :func:`address_of` knows and the bytes fit; False if not."""
    cdef unsigned char *to = address_of(target, True)
    cdef const unsigned char *frm = address_of(source, False)
    if to == NULL or frm == NULL or offset + n > byte_size(target) or start + n > byte_size(source):
        return False
    memcpy(to + offset, frm + start, n)
    return True
