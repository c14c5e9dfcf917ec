# C-level declarations of aiordma/transfer/_plan.py (compiled in Cython's
# pure Python mode): the loops over descriptors run in C.

cimport cython

@cython.locals(total=Py_ssize_t, i=Py_ssize_t, length=unsigned long long)
cpdef Py_ssize_t records_needed(const unsigned long long[::1] lengths, Py_ssize_t count,
                                unsigned long long piece) except -1

@cython.locals(i=Py_ssize_t)
cpdef Py_ssize_t mismatch(const unsigned long long[::1] llens,
                          const unsigned long long[::1] rlens, Py_ssize_t count) except -2

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, length=unsigned long long, la=unsigned long long,
               ra=unsigned long long, lkey=unsigned long long, rkey=unsigned long long,
               end_l=unsigned long long, end_r=unsigned long long,
               last_lkey=unsigned long long, last_rkey=unsigned long long,
               prev=unsigned long long, take=unsigned long long)
cpdef Py_ssize_t fill(const unsigned long long[::1] laddrs, const unsigned long long[::1] llens,
                      const unsigned int[::1] lregion, const unsigned int[::1] lkeys,
                      const unsigned long long[::1] raddrs, const unsigned int[::1] rregion,
                      const unsigned int[::1] rkeys, Py_ssize_t count,
                      unsigned long long piece, unsigned long long[::1] out) except -1
