# Type stub of the compiled driver (aiordma/verbs/_driver/_core.pyx). What
# its driver classes make is typed as the driver protocols (base.py), where
# their members are stated once; tests/verbs/test_driver_stub.py holds the
# compiled classes to those protocols.
from typing import Any

from aiordma.verbs._driver import base

ABI: int

def find_cq(cq: Any, fd: int, hint: int = 0) -> int: ...
def find_qp(qp: Any, cq_addr: int, recv_cq_addr: int, hint: int = 0) -> int: ...

class Completion:
    wr_id: int
    status: int
    opcode: int
    vendor_err: int
    byte_len: int
    imm_data: int
    qp_num: int
    wc_flags: int

# The classes, as what calling them gives (a class here would restate the
# protocols' members, or be abstract to mypy).
def CQDriver(address: int) -> base.CQDriver: ...
def QPDriver(address: int) -> base.QPDriver: ...
def SRQDriver(address: int) -> base.SRQDriver: ...
