# C-level declarations of aiordma/channel/outbox.py (compiled in Cython's
# pure Python mode).

from aiordma.channel.packets cimport Packets
from aiordma.channel.wire cimport Header

cdef class Outbox:
    cdef readonly Packets packets
    cdef object _stats
    cdef _sent(self, Py_ssize_t size)
    cpdef bint send_eager(self, object head, object body, Py_ssize_t size) except *
    cpdef Py_ssize_t send_eagers(self, object bodies, object sizes, Py_ssize_t start, bint in_turn)
    cpdef Py_ssize_t send_medium(self, object head, object view, Py_ssize_t size)
    cpdef Py_ssize_t send_pieces(self, object view, Py_ssize_t offset, Py_ssize_t size)
    cdef Py_ssize_t _pieces(self, object view, Py_ssize_t offset, Py_ssize_t size) except? -1
