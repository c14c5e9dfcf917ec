# C-level declarations of aiordma/_histogram.py (compiled in Cython's pure
# Python mode).

cdef class Histogram:
    cdef public list counts
    cdef public long long count
    cdef public double sum
    cpdef observe(self, double seconds)

cpdef record(dict histograms, str name, double seconds)
cpdef tally(object counters, str name, str amount_name, Py_ssize_t amount)
