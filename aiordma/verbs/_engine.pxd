# C-level declarations of aiordma/verbs/_engine.py (compiled in Cython's pure
# Python mode).

from aiordma.verbs._room cimport QueueRoom

cdef _let_go(object mr)

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

cdef class _Work:
    cdef public WorkEngine engine
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

cdef class WorkEngine:
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
    cdef readonly object _loop
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
    cdef long long _send_seq
    cdef object _silent
    cdef int _silent_run
    cdef int _signal_every
    cdef public object stats
    cdef bint _usable_now(self)
    cdef unsigned long long _register(self, _Work work)
    cdef bint _next_send(self, bint signaled)
    cdef _timed(self, _Work work, str kind)
    cpdef object quick_send(self, int opcode, object local, object remote, object imm, str kind)
    cpdef object quick_block(self, int opcode, object mr, unsigned long long addr,
                             long long length, unsigned long long raddr, unsigned int rkey,
                             str counter)
    cdef object _post_quick(self, int opcode, object mr, unsigned long long addr,
                            long long length, int flags, unsigned int imm,
                            unsigned long long raddr, unsigned int rkey, str kind)
    cpdef list quick_recvs(self, object locals_)
    cpdef list quick_sends(self, object ops, object send_type)
    cpdef complete(self, _Work work, object wc)
    cdef _finish(self, unsigned long long wr_id, _Work work)
    cdef _settle_silent(self, long long seq)
