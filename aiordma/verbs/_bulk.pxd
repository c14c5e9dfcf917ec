# C-level declarations of aiordma/verbs/_bulk.py (compiled in Cython's pure
# Python mode).

from aiordma.bulk_table cimport Layout
from aiordma.verbs._room cimport QueueRoom

cdef class BulkRun:
    cdef object _engine
    cdef object _post
    cdef dict _handlers
    cdef QueueRoom _sq
    cdef object _kick
    cdef int _opcode
    cdef object _table
    cdef Py_ssize_t _count
    cdef Py_ssize_t _window
    cdef Py_ssize_t _chunk
    cdef object _done
    cdef object _starved
    cdef Py_ssize_t _posted
    cdef Py_ssize_t _settled
    cdef public Py_ssize_t outstanding
    cdef object _error
    cdef long long _tag
    cdef bint _cancelled
    cdef bint _stopped
    cdef bint _waiting
    cdef bint _finished
    cdef unsigned long long _first
    cdef tuple _mrs
    cpdef start(self)
    cdef _pump(self)
    cdef _post_chunk(self, Py_ssize_t n)
    cdef _maybe_finish(self)
    cdef _finish(self)
