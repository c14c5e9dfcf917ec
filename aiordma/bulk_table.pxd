# C-level declarations of aiordma/bulk_table.py (compiled in Cython's pure
# Python mode): the record layout's numbers, which other compiled modules
# read as C fields.

cdef class Layout:
    cdef readonly Py_ssize_t record_words
    cdef readonly Py_ssize_t local_addr
    cdef readonly Py_ssize_t remote_addr
    cdef readonly Py_ssize_t length_lkey
    cdef readonly Py_ssize_t rkey_tag
