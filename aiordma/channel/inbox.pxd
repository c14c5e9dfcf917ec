# C-level declarations of aiordma/channel/inbox.py (compiled in Cython's pure
# Python mode), and the copies out of the receive slots that only compiled
# code makes.

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memcpy

from aiordma.channel.wire cimport Header, WireCodes, address_of, byte_size

cdef class Arrival:
    cdef public int slot
    cdef public Header header
    cdef public Py_ssize_t size
    cdef public int phase
    cdef public object copied
    cdef public object pieces
    cdef public long long missing
    cdef public object landed
    cdef public Py_ssize_t ring

cdef class Inbox:
    cdef readonly object view
    cdef readonly Py_ssize_t size
    cdef readonly unsigned long long max_message
    cdef readonly bint open
    cdef readonly object ready
    cdef readonly Arrival filling
    cdef public list acks_due
    cdef public list freed
    cdef readonly Arrival ahead
    cdef public bint new_objects
    cdef readonly Arrival sink
    cdef object _sink_target
    cdef Py_ssize_t _sink_offset
    cdef public object ring_view
    cpdef int step(self, Arrival arrival, int step) except? -1
    cpdef int arrived(self, int slot, Header header, Py_ssize_t size) except? -1
    cdef Py_ssize_t _split(self, int slot, Header header) except? -1
    cpdef arrived_record(self, Header header, Py_ssize_t offset, Py_ssize_t size)
    cpdef revoke(self, unsigned long long msg_id)
    cpdef Arrival eager_first(self)
    cdef object _source(self, Arrival arrival)
    cdef Py_ssize_t _start(self, Arrival arrival) except? -1
    cpdef bytes head(self, Arrival arrival)
    cpdef object small_body(self, Arrival arrival, object into)
    cpdef object take(self)
    cpdef Py_ssize_t take_medium(self, object into) except? -2
    cdef Py_ssize_t _first_packet(self, Arrival arrival, object target) except? -1
    cpdef Py_ssize_t copy_pieces(self, Arrival arrival, object target,
                                 Py_ssize_t offset) except? -1
    cpdef bint sink_pieces(self) except? -1


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
