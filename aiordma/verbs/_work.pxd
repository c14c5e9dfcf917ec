# C-level declarations of aiordma/verbs/_work.py (compiled in Cython's pure
# Python mode).

cdef class SendRequest:
    cdef public int opcode
    cdef public tuple segments
    cdef public int flags
    cdef public object imm
    cdef public object remote_addr
    cdef public object rkey
    cdef public object compare_add
    cdef public object swap
    cdef public bint signaled

cdef class Completer:
    cdef readonly object loop
    cpdef complete(self, Work work, object wc)

cdef class Work:
    cdef public Completer engine
    cdef public object wr_id
    cdef public object future
    cdef public object done
    cdef public bint reported
    cdef public int opcode
    cdef public tuple mrs
    cdef public long long length
    cdef public bint recv
    cdef public int scratch
    cdef public long long seq
    cdef public bint silent
    cdef public object kind
    cdef public double started
    cpdef succeed(self, long long byte_len, object result)

cdef class Unsignalled:
    cdef readonly int every
    cdef readonly long long seq
    cdef int _run
    cdef object _queued
    cpdef bint next(self, bint signaled)
    cpdef refused(self)
    cpdef queue(self, Work work)
    cpdef Work settled(self, long long seq)
