# C-level declarations of aiordma/transfer/_plan.py (compiled in Cython's
# pure Python mode): the loops over descriptors run in C.

cimport cython

from aiordma.bulk_table cimport Layout

ctypedef unsigned long long u64

@cython.locals(total=Py_ssize_t, i=Py_ssize_t, length=u64)
cpdef Py_ssize_t records_needed(const unsigned long long[::1] lengths, Py_ssize_t count,
                                unsigned long long piece) except -1

@cython.locals(i=Py_ssize_t)
cpdef Py_ssize_t mismatch(const unsigned long long[::1] llens,
                          const unsigned long long[::1] rlens, Py_ssize_t count) except -2

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, length=u64, la=u64,
               ra=u64, lkey=u64, rkey=u64,
               end_l=u64, end_r=u64,
               last_lkey=u64, last_rkey=u64,
               prev=u64, take=u64, last=Py_ssize_t, base=Py_ssize_t)
cpdef Py_ssize_t fill(const unsigned long long[::1] laddrs, const unsigned long long[::1] llens,
                      const unsigned int[::1] lregion, const unsigned int[::1] lkeys,
                      const unsigned long long[::1] raddrs, const unsigned int[::1] rregion,
                      const unsigned int[::1] rkeys, Py_ssize_t count,
                      unsigned long long piece, unsigned long long[::1] out) except -1
