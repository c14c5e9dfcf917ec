# C-level declarations of aiordma/verbs/_lane.py (compiled in Cython's pure
# Python mode).

from aiordma.verbs._room cimport QueueRoom

cdef class PacketLane:
    cdef object _engine
    cdef object _post_send
    cdef object _post_list
    cdef object _post_recv
    cdef object _kick
    cdef QueueRoom _sq
    cdef dict _handlers
    cdef Py_ssize_t _size
    cdef int _sends
    cdef int _recvs
    cdef unsigned long long _send_base
    cdef unsigned int _send_lkey
    cdef unsigned long long _recv_base
    cdef unsigned int _recv_lkey
    cdef object _sent
    cdef object _arrived
    cdef object _failed
    cdef object _written
    cdef list _seq
    cdef long long _next_seq
    cdef object _silent
    cdef int _silent_run
    cdef int _signal_every
    cdef bytearray _posted
    cdef public int outstanding
    cdef bint _stopped
    cdef bint _holding
    cdef list _staged_ids
    cdef list _staged_flags
    cdef list _staged_addrs
    cdef list _staged_lengths
    cdef public list unposted
    cdef unsigned long long _first
    cdef tuple _mrs
    cpdef send(self, int slot, Py_ssize_t length)
    cpdef hold(self)
    cpdef int flush(self) except? -1
    cdef _unstage(self, Py_ssize_t posted)
    cpdef recv(self, int slot)
    cpdef bint send_room(self) except *
    cdef _send_completed(self, int slot, int status, object wc)
