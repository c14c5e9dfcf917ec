# C-level declarations of aiordma/verbs/_completed.py (compiled in Cython's
# pure Python mode).

cdef class WorkCompletion:
    cdef object _wr_id
    cdef object _opcode
    cdef object _byte_len
    cdef object _imm_data
    cdef object _qp_num
    cdef object _atomic_value

cpdef object from_wc(object wc, object atomic_value=*)
