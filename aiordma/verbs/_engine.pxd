# C-level declarations of aiordma/verbs/_engine.py (compiled in Cython's pure
# Python mode).

from aiordma.verbs._room cimport QueueRoom
from aiordma.verbs._work cimport Completer, SendRequest, Unsignalled, Work

cdef _hold(tuple mrs)
cdef _let_go(object mr)

cdef class WorkEngine(Completer):
    cdef public object qp
    cdef public object qp_num
    cdef public object cq
    cdef public QueueRoom sq
    cdef public QueueRoom rq
    cdef public dict works
    cdef public object failure
    cdef public bint closing
    cdef public object close_error
    cdef public object drained
    cdef public object last_send
    cdef public list posters
    cdef object _alloc
    cdef object _pd
    cdef long long _max_inline
    cdef object _scratch
    cdef list _scratch_free
    cdef public object driver
    cdef object _post_one
    cdef object _post_recv
    cdef dict _handlers
    cdef object _kick
    cdef object _expect
    cdef unsigned long long _next_id
    cdef unsigned long long _last_id
    cdef unsigned long _thread
    cdef Unsignalled _unsignalled
    cdef public object stats
    cdef bint _usable_now(self)
    cdef unsigned long long _register(self, Work work)
    cdef _timed(self, Work work, str kind)
    cdef object _plain(self, object local, bint writable)
    cdef _posted(self, Work work)
    cdef _chain_posted(self, list works, QueueRoom room, int rc)
    cdef _tell_cq(self, bint answered)
    cpdef object quick_send(self, int opcode, object local, object remote, object imm, str kind)
    cpdef object quick_block(self, int opcode, object mr, unsigned long long addr,
                             long long length, unsigned long long raddr, unsigned int rkey,
                             str counter)
    cdef object _post_quick(self, int opcode, object mr, unsigned long long addr,
                            long long length, int flags, unsigned int imm,
                            unsigned long long raddr, unsigned int rkey, str kind)
    cpdef list quick_recvs(self, object locals_)
    cpdef list quick_sends(self, object ops, object send_type)
    cpdef complete(self, Work work, object wc)
    cdef _finish(self, unsigned long long wr_id, Work work)
    cdef _settle_silent(self, long long seq)
