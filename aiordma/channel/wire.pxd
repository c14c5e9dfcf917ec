# C-level declarations of aiordma/channel/wire.py (compiled in Cython's pure
# Python mode): what other compiled modules read without Python in between.

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
