# C-level declarations of aiordma/channel/wire.py (compiled in Cython's pure
# Python mode): what other compiled modules read without Python in between,
# and the header's layout (<BBBBHHQQQIHH, little-endian) as C loads and
# stores. tests/channel/test_wire.py holds them to the struct.

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.memoryview cimport PyMemoryView_GET_BUFFER
from cpython.object cimport PyObject
from cpython.buffer cimport PyBuffer_IsContiguous
from libc.string cimport memcpy

cdef class Header:
    cdef readonly object kind
    cdef readonly int code
    cdef readonly int credits
    cdef readonly unsigned long long msg_id
    cdef readonly unsigned long long length
    cdef readonly object remote
    cdef readonly int head_length
    cdef readonly int control_credits
    cdef readonly int flags
    cdef readonly int ring

cdef class WireCodes:
    cdef public int eager
    cdef public int rendezvous
    cdef public int done
    cdef public int credit
    cdef public int control_credit
    cdef public int revoke
    cdef public int hello
    cdef public int medium
    cdef public int piece
    cdef public int batch
    cdef public int record
    cdef public Py_ssize_t header_size

cpdef Header checked(int magic, int version, int kind, int flags, int credits, int control,
                     unsigned long long msg_id, unsigned long long length,
                     unsigned long long addr, unsigned int rkey, int head, int ring,
                     Py_ssize_t carried, unsigned long long limit)

# -- bytes at an address ------------------------------------------------------

cdef inline unsigned char *address_of(object buf, bint writable):
    """The first byte of ``buf`` (bytes, bytearray or a C-contiguous memoryview;
    NULL for anything else, or for bytes when ``writable``)."""
    cdef Py_buffer *view
    if type(buf) is memoryview:
        view = PyMemoryView_GET_BUFFER(buf)
        if (writable and view.readonly) or not PyBuffer_IsContiguous(view, b'C'):
            return NULL
        return <unsigned char *>view.buf
    if type(buf) is bytearray:
        return <unsigned char *>PyByteArray_AS_STRING(buf)
    if type(buf) is bytes and not writable:
        return <unsigned char *>PyBytes_AS_STRING(buf)
    return NULL

cpdef Py_ssize_t write_packet(object view, Py_ssize_t start, Py_ssize_t room, Header header,
                              object head, object body) except? -1
cpdef Header read_packet(object view, Py_ssize_t start, Py_ssize_t size, Py_ssize_t room,
                         unsigned long long limit)

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

cdef inline void put16(unsigned char *p, unsigned int v) noexcept:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF

cdef inline void put32(unsigned char *p, unsigned int v) noexcept:
    put16(p, v & 0xFFFF)
    put16(p + 2, v >> 16)

cdef inline void put64(unsigned char *p, unsigned long long v) noexcept:
    put32(p, v & 0xFFFFFFFFu)
    put32(p + 4, v >> 32)

cdef inline unsigned int get16(const unsigned char *p) noexcept:
    return p[0] | (<unsigned int>p[1] << 8)

cdef inline unsigned int get32(const unsigned char *p) noexcept:
    return get16(p) | (get16(p + 2) << 16)

cdef inline unsigned long long get64(const unsigned char *p) noexcept:
    return get32(p) | (<unsigned long long>get32(p + 4) << 32)

# -- the header at an address ---------------------------------------------------

cdef inline void store_header(unsigned char *p, Header h, unsigned long long addr,
                              unsigned int rkey) noexcept:
    """Write ``h`` (its remote buffer's ``addr`` and ``rkey``) in the 40 bytes at ``p``."""
    p[0] = 0xA5  # MAGIC
    p[1] = 7  # VERSION
    p[2] = h.code
    p[3] = h.flags
    put16(p + 4, h.credits)
    put16(p + 6, h.control_credits)
    put64(p + 8, h.msg_id)
    put64(p + 16, h.length)
    put64(p + 24, addr)
    put32(p + 32, rkey)
    put16(p + 36, h.head_length)
    put16(p + 38, h.ring)

cdef inline Header load_header(const unsigned char *p, Py_ssize_t size, unsigned long long limit):
    """The checked header of the ``size``-byte packet at ``p`` (at least 40 bytes)."""
    return checked(p[0], p[1], p[2], p[3], get16(p + 4), get16(p + 6), get64(p + 8),
                   get64(p + 16), get64(p + 24), get32(p + 32), get16(p + 36),
                   get16(p + 38), size - 40, limit)

cdef inline bint store_into(object buf, Header h, unsigned long long addr,
                            unsigned int rkey) except -1:
    """Write ``h`` at the start of ``buf`` (checked to be long enough) if it is
    writable memory :func:`address_of` knows; False if not."""
    cdef unsigned char *p = address_of(buf, True)
    if p == NULL:
        return False
    store_header(p, h, addr, rkey)
    return True

cdef inline Header load_from(object data, Py_ssize_t size, unsigned long long limit):
    """The checked header at the start of ``data`` (``size`` bytes, at least
    40), or None if it is not memory :func:`address_of` knows."""
    cdef const unsigned char *p = address_of(data, False)
    if p == NULL:
        return None
    return load_header(p, size, limit)
