# C-level declarations of aiordma/_loop_check.py (compiled in Cython's pure
# Python mode).

cdef object _confirmed
cdef unsigned long _thread

cpdef check_loop(object loop)
