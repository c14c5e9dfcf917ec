# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled driver (see ``base.py`` for the interface it implements).

pyverbs owns every verbs resource; this module only *uses* the CQ, channel,
QP and SRQ that pyverbs created, through their C handles. Where pyverbs
exposes a handle (``handles.py`` asks first) :func:`find_cq` and
:func:`find_qp` check that one address; pyverbs 44 exposes none, so they
search the pyverbs object for the pointer and accept it only when the
structure it points at matches facts learnt independently (the CQ's size
and the channel's descriptor; the QP's number, type and CQs). Reading a
candidate goes through ``process_vm_readv`` on this process, which fails
cleanly on an unmapped address, so a wrong guess can never crash. An
object whose handle was not found gets the pure driver.

What runs here:

* :class:`CQDriver`: takes a channel event and acknowledges it at once,
  arms the CQ, and drains it with ``ibv_poll_cq`` into a C array, handing
  each completion (a light :class:`Completion`) straight to the handler that
  posted it; it can also spin on the CQ for a bounded time without running
  any Python per empty poll.
* :class:`QPDriver`: builds send and receive work requests on the stack
  from plain integers and posts them as one linked list.
* :class:`SRQDriver`: posts receives on the SRQ a found QP receives from.
"""

from libc.stdint cimport uint32_t, uint64_t, uintptr_t
from libc.string cimport memset
from libc.errno cimport errno, EAGAIN
from libc.stdlib cimport malloc, free
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from cpython.dict cimport PyDict_GetItem, PyDict_DelItem
from cpython.ref cimport PyObject


cdef extern from "sys/uio.h" nogil:
    struct iovec:
        void *iov_base
        size_t iov_len
    ssize_t process_vm_readv(int pid, const iovec *local_iov, unsigned long liovcnt,
                             const iovec *remote_iov, unsigned long riovcnt,
                             unsigned long flags)

cdef extern from "unistd.h" nogil:
    int getpid()

cdef extern from "arpa/inet.h" nogil:
    uint32_t htonl(uint32_t)
    uint32_t ntohl(uint32_t)

cdef extern from "infiniband/verbs.h" nogil:
    struct ibv_context:
        pass
    struct ibv_comp_channel:
        ibv_context *context
        int fd
    struct ibv_cq:
        ibv_context *context
        ibv_comp_channel *channel
        int cqe
    struct ibv_srq:
        ibv_context *context
    struct ibv_qp:
        ibv_context *context
        ibv_cq *send_cq
        ibv_cq *recv_cq
        ibv_srq *srq
        uint32_t qp_num
        int qp_type
    struct ibv_sge:
        uint64_t addr
        uint32_t length
        uint32_t lkey
    struct _wr_rdma:
        uint64_t remote_addr
        uint32_t rkey
    struct _wr_atomic:
        uint64_t remote_addr
        uint64_t compare_add
        uint64_t swap
        uint32_t rkey
    union _wr_union:
        _wr_rdma rdma
        _wr_atomic atomic
    struct ibv_send_wr:
        uint64_t wr_id
        ibv_send_wr *next
        ibv_sge *sg_list
        int num_sge
        int opcode
        unsigned int send_flags
        uint32_t imm_data
        _wr_union wr
    struct ibv_recv_wr:
        uint64_t wr_id
        ibv_recv_wr *next
        ibv_sge *sg_list
        int num_sge
    struct ibv_wc:
        uint64_t wr_id
        int status
        int opcode
        uint32_t vendor_err
        uint32_t byte_len
        uint32_t imm_data
        uint32_t qp_num
        uint32_t src_qp
        unsigned int wc_flags
    int ibv_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr)
    int ibv_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr)
    int ibv_post_srq_recv(ibv_srq *srq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr)
    int ibv_poll_cq(ibv_cq *cq, int num_entries, ibv_wc *wc)
    int ibv_req_notify_cq(ibv_cq *cq, int solicited_only)
    int ibv_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context)
    void ibv_ack_cq_events(ibv_cq *cq, unsigned int nevents)
    enum:
        IBV_WC_RECV  # set in the opcode of every receive completion


cdef enum:
    POLL_BATCH = 16
    MAX_STACK_WRS = 16
    WR_SEND = 2
    WR_SEND_WITH_IMM = 3
    WR_ATOMIC_CMP_AND_SWP = 5
    WR_ATOMIC_FETCH_AND_ADD = 6
    SEND_SIGNALED = 2

ABI = 8
"""Bumped whenever the Python side's expectations of this module change."""

from aiordma import bulk_table as _bulk_table

# A bulk table's layout (aiordma/bulk_table.py), as C values read at import,
# not cimported from bulk_table.pxd as the typed modules do: this core also
# runs when they run from source, where bulk_table's Layout is no C type.
cdef Py_ssize_t TABLE_WORDS = _bulk_table.LAYOUT.record_words
cdef Py_ssize_t LOCAL_ADDR = _bulk_table.LAYOUT.local_addr
cdef Py_ssize_t REMOTE_ADDR = _bulk_table.LAYOUT.remote_addr
cdef Py_ssize_t LENGTH_LKEY = _bulk_table.LAYOUT.length_lkey
cdef Py_ssize_t RKEY_TAG = _bulk_table.LAYOUT.rkey_tag


# -- locating handles inside pyverbs objects --------------------------------

cdef bint _read(uintptr_t addr, void *out, size_t size) noexcept nogil:
    """Copy ``size`` bytes at ``addr`` into ``out``; False (no crash) if unmapped."""
    cdef iovec local, remote
    local.iov_base = out
    local.iov_len = size
    remote.iov_base = <void *>addr
    remote.iov_len = size
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == <ssize_t>size


cdef list _candidates(object obj):
    """Every aligned, non-null pointer-sized word in ``obj``'s C struct."""
    cdef uintptr_t *words = <uintptr_t *><PyObject *>obj
    cdef Py_ssize_t count = type(obj).__basicsize__ // sizeof(uintptr_t)
    cdef Py_ssize_t i
    cdef list found = []
    for i in range(2, count):  # past the refcount and the type
        if words[i] != 0 and words[i] % sizeof(uintptr_t) == 0:
            found.append(words[i])
    return found


def find_cq(object cq, int fd, uintptr_t hint=0):
    """The address of the ``ibv_cq`` inside the pyverbs ``cq``, or 0.

    With a ``hint`` (the handle pyverbs exposes) only that address is a
    candidate. Accepted only if exactly one candidate has the CQ's size (``cqe``), a
    completion channel whose descriptor is ``fd`` (found independently, in
    ``/proc/self/fd``), and the same device context as that channel.
    """
    cdef ibv_cq c
    cdef ibv_comp_channel ch
    cdef int cqe
    cdef uintptr_t found = 0
    cdef uintptr_t p
    if not isinstance(getattr(cq, "cqe", None), int):
        return 0  # not a CQ
    cqe = cq.cqe
    for p in ([hint] if hint else _candidates(cq)):
        if not _read(p, &c, sizeof(ibv_cq)):
            continue
        if c.cqe != cqe or c.channel == NULL or c.context == NULL:
            continue
        if not _read(<uintptr_t>c.channel, &ch, sizeof(ibv_comp_channel)):
            continue
        if ch.fd != fd or ch.context != c.context:
            continue
        if found != 0 and found != p:
            return 0  # ambiguous: trust neither
        found = p
    return found


def find_qp(object qp, uintptr_t cq_addr, uintptr_t recv_cq_addr, uintptr_t hint=0):
    """The address of the ``ibv_qp`` inside the pyverbs ``qp``, or 0 (with a
    ``hint``, only that address is a candidate).

    Accepted only if exactly one candidate carries the QP's number and type
    and uses the CQs at ``cq_addr`` and ``recv_cq_addr`` (found by
    :func:`find_cq`) for its send and receive completions.
    """
    cdef ibv_qp q
    cdef uint32_t qp_num
    cdef int qp_type
    cdef uintptr_t found = 0
    cdef uintptr_t p
    if cq_addr == 0 or recv_cq_addr == 0 or not isinstance(getattr(qp, "qp_num", None), int):
        return 0  # no CQ to match, or not a QP
    qp_num = qp.qp_num
    qp_type = qp.qp_type
    for p in ([hint] if hint else _candidates(qp)):
        if not _read(p, &q, sizeof(ibv_qp)):
            continue
        if q.qp_num != qp_num or q.qp_type != qp_type:
            continue
        if <uintptr_t>q.send_cq != cq_addr or <uintptr_t>q.recv_cq != recv_cq_addr:
            continue
        if found != 0 and found != p:
            return 0
        found = p
    return found


# -- completions --------------------------------------------------------------

cdef class Completion:
    """One work completion, with the fields of pyverbs' ``WC`` that aiordma reads."""

    cdef readonly uint64_t wr_id
    cdef readonly int status
    cdef readonly int opcode
    cdef readonly uint32_t vendor_err
    cdef readonly uint32_t byte_len
    cdef readonly uint32_t imm_data
    """As on the wire (network byte order), like pyverbs' ``WC.imm_data``."""
    cdef readonly uint32_t qp_num
    cdef readonly unsigned int wc_flags

    def __repr__(self):
        return (f"<Completion wr_id={self.wr_id} status={self.status} "
                f"opcode={self.opcode} byte_len={self.byte_len}>")


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef class CQDriver:
    """The C side of one :class:`aiordma.CompletionQueue`.

    It holds no reference to the pyverbs ``CQ`` (that would change the order
    pyverbs tears objects down in): its owner calls :meth:`detach` before
    closing the CQ.

    ``handlers`` maps ``wr_id`` to the object whose ``complete(wc)`` gets
    that work request's completion (the same dict the Python path uses).
    :meth:`on_readable` is the loop's reader callback: one wake-up is one
    call into C, and Python runs only in the handlers it completes.
    """

    cdef ibv_cq *cq
    cdef ibv_comp_channel *channel
    cdef ibv_wc stash
    cdef bint stashed
    cdef public bint armed
    cdef public bint polling
    cdef public unsigned long long received
    cdef public unsigned long long arms
    cdef public unsigned long long completions
    cdef public unsigned long long wakeups
    cdef dict handlers
    cdef object report
    cdef object more
    cdef int budget

    @property
    def address(self):
        """Where the ``ibv_cq`` is (0 once detached)."""
        return <uintptr_t>self.cq

    @property
    def compiled(self):
        return True

    def __cinit__(self, uintptr_t address):
        self.cq = <ibv_cq *>address
        self.channel = self.cq.channel
        self.stashed = False
        self.armed = False
        self.polling = False
        self.received = 0
        self.arms = 0
        self.completions = 0
        self.wakeups = 0
        self.handlers = {}
        self.budget = 1

    cdef int _check(self) except -1:
        if self.cq == NULL:
            raise ValueError("the completion queue driver was detached")
        return 0

    def attach(self, dict handlers, object report, int budget, object more):
        """Where :meth:`serve` hands completions (``handlers``, ``report``),
        how many it handles per call (``budget``), and what it calls when
        that runs out before the CQ is empty (``more()``)."""
        self.handlers = handlers
        self.report = report
        self.budget = budget
        self.more = more

    def take_event(self):
        """Consume one channel event if one is pending (the fd is non-blocking)."""
        self._check()
        return self._take_event()

    cdef bint _take_event(self) except -1:
        cdef ibv_cq *ev_cq
        cdef void *ctx
        if ibv_get_cq_event(self.channel, &ev_cq, &ctx) != 0:
            if errno == EAGAIN:
                return False
            raise OSError(errno, "ibv_get_cq_event failed")
        # Acknowledged at once (a mutex, no system call): pyverbs does not
        # know of events taken here, and destroying a CQ with unacknowledged
        # events blocks, so none is ever left outstanding.
        ibv_ack_cq_events(self.cq, 1)
        self.armed = False  # one event per arming
        self.wakeups += 1
        return True

    def req_notify(self):
        self._check()
        self._req_notify()

    cdef int _req_notify(self) except -1:
        cdef int rc = ibv_req_notify_cq(self.cq, 0)
        if rc != 0:
            raise OSError(rc, "ibv_req_notify_cq failed")
        self.armed = True
        self.arms += 1
        return 0

    cdef int _dispatch(self, ibv_wc *src, dict handlers, object report) except -1:
        cdef Completion wc = Completion.__new__(Completion)
        cdef PyObject *handler
        wc.wr_id = src.wr_id
        wc.status = src.status
        wc.opcode = src.opcode
        wc.vendor_err = src.vendor_err
        wc.byte_len = src.byte_len
        wc.imm_data = src.imm_data
        wc.qp_num = src.qp_num
        wc.wc_flags = src.wc_flags
        if src.status == 0 and src.opcode & IBV_WC_RECV:  # a failed one's opcode is undefined
            self.received += 1
        self.completions += 1
        key = wc.wr_id
        handler = PyDict_GetItem(handlers, key)
        if handler == NULL:
            report(None, wc)
            return 0
        target = <object>handler
        PyDict_DelItem(handlers, key)
        try:
            target.complete(wc)
        except Exception as exc:
            report(exc, wc)
        return 0

    def drain(self, dict handlers, int budget, object report):
        """Hand out completions until the CQ is empty or ``budget`` are handled.

        Returns ``(handled, empty)``. A handler that raises is reported
        through ``report(exc, wc)``; a completion nobody registered is given
        to ``report(None, wc)``.
        """
        cdef bint empty = True
        self._check()
        handled = self._drain(handlers, budget, report, &empty)
        return handled, empty

    cdef int _drain(self, dict handlers, int budget, object report, bint *empty) except -1:
        cdef ibv_wc wcs[POLL_BATCH]
        cdef int n, i
        cdef int handled = 0
        empty[0] = True
        if self.stashed:
            self.stashed = False
            handled = 1
            self._dispatch(&self.stash, handlers, report)
        while True:
            if self.cq == NULL:  # a handler closed the CQ
                return handled
            n = ibv_poll_cq(self.cq, POLL_BATCH, wcs)
            if n < 0:
                raise OSError(-n, "ibv_poll_cq failed")
            for i in range(n):
                self._dispatch(&wcs[i], handlers, report)
            handled += n
            if n < POLL_BATCH:
                return handled
            if handled >= budget:
                empty[0] = False
                return handled

    def on_readable(self):
        """The loop's reader callback for the channel's descriptor: :meth:`serve`
        after taking one event (one, however many completions came)."""
        self.serve(True)

    cpdef int serve(self, bint event) except -1:
        """Take one event (if ``event``), hand out completions until the CQ
        is empty, then arm it if it is not armed (nor :attr:`polling`) and poll
        once more (a completion that raced with the arming raises no event). If the
        budget runs out first, call ``more()`` and stop. How many were handled."""
        cdef int handled = 0
        cdef bint empty = True
        if self.cq == NULL:
            return 0
        if event:
            self._take_event()
        while self.cq != NULL:
            handled += self._drain(self.handlers, self.budget - handled, self.report, &empty)
            if self.cq == NULL:  # a handler closed the CQ
                break
            if empty:
                if self.armed or self.polling:
                    break
                self._req_notify()
            elif handled >= self.budget:
                self.more()
                break
        return handled

    def spin(self, double seconds):
        """Poll the CQ, running no Python, until a completion arrives or
        ``seconds`` pass; True if one arrived (kept for the next :meth:`drain`)."""
        cdef double until
        cdef int n = 0
        self._check()
        if self.stashed:
            return True
        with nogil:
            until = _now() + seconds
            while True:
                n = ibv_poll_cq(self.cq, 1, &self.stash)
                if n != 0 or _now() >= until:
                    break
        if n < 0:
            raise OSError(-n, "ibv_poll_cq failed")
        self.stashed = n > 0
        return self.stashed

    def detach(self):
        """Stop using the CQ (before pyverbs closes it), and let go of the
        handlers and callbacks (they refer back to the CQ's owner)."""
        self.cq = NULL
        self.channel = NULL
        self.handlers = {}
        self.report = None
        self.more = None


# -- work requests --------------------------------------------------------------

cdef class _Scatter:
    """The scatter/gather entries of one post: on the stack of this object
    for up to ``MAX_STACK_WRS`` of them, else in one allocation."""

    cdef ibv_sge stack[MAX_STACK_WRS]
    cdef ibv_sge *sges
    cdef Py_ssize_t used

    def __cinit__(self, list requests, Py_ssize_t field):
        cdef Py_ssize_t total = 0
        for request in requests:
            total += len(request[field])
        self.sges = self.stack
        self.used = 0
        if total > MAX_STACK_WRS:
            self.sges = <ibv_sge *>malloc(total * sizeof(ibv_sge))
            if self.sges == NULL:
                raise MemoryError()

    def __dealloc__(self):
        if self.sges != self.stack:
            free(self.sges)

    cdef int fill(self, object segments, ibv_sge **first) except -1:
        """Copy ``segments`` into the next entries; point ``first`` at them; how many."""
        cdef Py_ssize_t n = len(segments)
        cdef Py_ssize_t j
        first[0] = &self.sges[self.used]
        for j in range(n):
            seg = segments[j]
            self.sges[self.used] = ibv_sge(addr=seg.addr, length=seg.length, lkey=seg.lkey)
            self.used += 1
        return <int>n


cdef inline void _one_recv(ibv_recv_wr *wr, ibv_sge *sge, uint64_t wr_id, uint64_t addr,
                           uint32_t length, uint32_t lkey) noexcept nogil:
    sge[0] = ibv_sge(addr=addr, length=length, lkey=lkey)
    wr[0] = ibv_recv_wr(wr_id=wr_id, next=NULL, sg_list=sge, num_sge=1)


cdef int _heap_chain(Py_ssize_t count, ibv_send_wr **wrs, ibv_sge **sges) except -1:
    """Point ``wrs`` and ``sges`` at heap arrays of ``count`` entries (a chain
    longer than the stack's); the caller frees both."""
    wrs[0] = <ibv_send_wr *>malloc(count * sizeof(ibv_send_wr))
    sges[0] = <ibv_sge *>malloc(count * sizeof(ibv_sge))
    if wrs[0] == NULL or sges[0] == NULL:
        free(wrs[0])
        free(sges[0])
        raise MemoryError()
    return 0


cdef class QPDriver:
    """Posts work requests on one pyverbs QP from plain integers (its owner
    calls :meth:`detach` before destroying the QP)."""

    cdef ibv_qp *qp
    cdef public unsigned long long sends
    """Send-queue work requests posted (sends, writes, reads, atomics)."""
    cdef public unsigned long long receives
    """Receives posted on this QP's own receive queue."""
    cdef public unsigned long long doorbells
    """Calls of ``ibv_post_send`` that posted at least one request."""

    def __cinit__(self, uintptr_t address):
        self.qp = <ibv_qp *>address
        self.sends = 0
        self.receives = 0
        self.doorbells = 0

    cdef inline int _sent(self, int rc, Py_ssize_t count, ibv_send_wr *wrs, ibv_send_wr *bad):
        """Count a posted chain of ``count`` (``rc``, ``bad``: what the provider said)."""
        cdef Py_ssize_t posted = count
        if rc != 0:
            posted = (bad - wrs) if bad != NULL else 0
        if posted > 0:
            self.sends += posted
            self.doorbells += 1
        return rc

    cdef inline int _received(self, int rc, Py_ssize_t count, ibv_recv_wr *wrs, ibv_recv_wr *bad):
        cdef Py_ssize_t posted = count
        if rc != 0:
            posted = (bad - wrs) if bad != NULL else 0
        self.receives += posted
        return rc

    @property
    def compiled(self):
        return True

    @property
    def srq_address(self):
        """Where the ``ibv_srq`` this QP receives from is (0: none, or detached)."""
        return <uintptr_t>self.qp.srq if self.qp != NULL else 0

    def detach(self):
        """Stop using the QP (before pyverbs destroys it)."""
        self.qp = NULL

    cdef int _check(self) except -1:
        if self.qp == NULL:
            raise ValueError("the queue pair driver was detached")
        return 0

    def post_sends(self, list requests):
        """Post ``requests`` as one linked list; 0 or the provider's errno.

        Each request is ``(wr_id, opcode, flags, imm, segments, remote_addr,
        rkey, compare_add, swap)``; ``segments`` is a sequence of objects with
        ``addr``, ``length`` and ``lkey``; ``imm`` is in host byte order.
        """
        cdef Py_ssize_t count = len(requests)
        cdef Py_ssize_t i
        cdef ibv_send_wr stack_wrs[MAX_STACK_WRS]
        cdef _Scatter scatter = _Scatter(requests, 4)
        cdef ibv_send_wr *wrs = stack_wrs
        cdef ibv_send_wr *wr
        cdef ibv_send_wr *bad = NULL
        cdef int opcode
        self._check()
        if count == 0:
            return 0
        if count > MAX_STACK_WRS:
            wrs = <ibv_send_wr *>malloc(count * sizeof(ibv_send_wr))
            if wrs == NULL:
                raise MemoryError()
        try:
            memset(wrs, 0, count * sizeof(ibv_send_wr))
            for i in range(count):
                request = requests[i]
                wr = &wrs[i]
                opcode = request[1]
                wr.wr_id = request[0]
                wr.opcode = opcode
                wr.send_flags = request[2]
                wr.imm_data = htonl(<uint32_t>request[3])
                wr.num_sge = scatter.fill(request[4], &wr.sg_list)
                if opcode == WR_ATOMIC_CMP_AND_SWP or opcode == WR_ATOMIC_FETCH_AND_ADD:
                    wr.wr.atomic.remote_addr = request[5]
                    wr.wr.atomic.rkey = request[6]
                    wr.wr.atomic.compare_add = request[7]
                    wr.wr.atomic.swap = request[8]
                elif opcode != WR_SEND and opcode != WR_SEND_WITH_IMM:
                    wr.wr.rdma.remote_addr = request[5]
                    wr.wr.rdma.rkey = request[6]
                wr.next = &wrs[i + 1] if i + 1 < count else NULL
            return self._sent(ibv_post_send(self.qp, wrs, &bad), count, wrs, bad)
        finally:
            if wrs != stack_wrs:
                free(wrs)

    def post_send(self, uint64_t wr_id, int opcode, unsigned int flags,
                  uint64_t addr, uint32_t length, uint32_t lkey, uint32_t imm=0,
                  uint64_t remote_addr=0, uint32_t rkey=0):
        """Post one request (not an atomic) with one buffer: the message
        channel's packets, and a single awaited send, write or read; ``imm``
        in host byte order. 0 or the provider's errno."""
        cdef ibv_send_wr wr
        cdef ibv_sge sge
        cdef ibv_send_wr *bad = NULL
        self._check()
        memset(&wr, 0, sizeof(wr))
        sge = ibv_sge(addr=addr, length=length, lkey=lkey)
        wr.wr_id = wr_id
        wr.opcode = opcode
        wr.send_flags = flags
        wr.imm_data = htonl(imm)
        wr.sg_list = &sge
        wr.num_sge = 1
        if opcode != WR_SEND and opcode != WR_SEND_WITH_IMM:
            wr.wr.rdma.remote_addr = remote_addr
            wr.wr.rdma.rkey = rkey
        return self._sent(ibv_post_send(self.qp, &wr, &bad), 1, &wr, bad)

    def post_send_list(self, list ids, list flags, list addrs, list lengths, uint32_t lkey):
        """Post sends (no immediate data) of one buffer each, all with ``lkey``,
        as one linked list: one doorbell. Returns ``(errno, posted)``: 0 and
        their number, or the provider's errno and how many were posted before
        the one it refused."""
        cdef Py_ssize_t count = len(ids)
        cdef Py_ssize_t i
        cdef ibv_send_wr stack_wrs[MAX_STACK_WRS]
        cdef ibv_sge stack_sges[MAX_STACK_WRS]
        cdef ibv_send_wr *wrs = stack_wrs
        cdef ibv_sge *sges = stack_sges
        cdef ibv_send_wr *bad = NULL
        cdef int rc
        self._check()
        if count == 0:
            return 0, 0
        if len(flags) != count or len(addrs) != count or len(lengths) != count:
            raise ValueError("a send list's columns differ in length")
        if count > MAX_STACK_WRS:
            _heap_chain(count, &wrs, &sges)
        try:
            memset(wrs, 0, count * sizeof(ibv_send_wr))
            for i in range(count):
                sges[i] = ibv_sge(addr=addrs[i], length=lengths[i], lkey=lkey)
                wrs[i].wr_id = ids[i]
                wrs[i].opcode = WR_SEND
                wrs[i].send_flags = flags[i]
                wrs[i].sg_list = &sges[i]
                wrs[i].num_sge = 1
                wrs[i].next = &wrs[i + 1] if i + 1 < count else NULL
            rc = self._sent(ibv_post_send(self.qp, wrs, &bad), count, wrs, bad)
            if rc == 0:
                return 0, count
            return rc, (bad - wrs) if bad != NULL else 0
        finally:
            if wrs != stack_wrs:
                free(wrs)
                free(sges)

    def post_table(self, uint64_t first_id, uint64_t ring, int opcode,
                   const unsigned long long[::1] table, Py_ssize_t start, Py_ssize_t count):
        """Post records ``start .. start + count`` of a one-sided table as one
        linked list, only the last signalled; 0 or the provider's errno.
        Records are :mod:`aiordma.bulk_table`'s; record ``r`` gets ``wr_id``
        ``first_id + r % ring``.
        """
        cdef ibv_send_wr stack_wrs[MAX_STACK_WRS]
        cdef ibv_sge stack_sges[MAX_STACK_WRS]
        cdef ibv_send_wr *wrs = stack_wrs
        cdef ibv_sge *sges = stack_sges
        cdef ibv_send_wr *bad = NULL
        cdef Py_ssize_t i, r
        cdef uint64_t word
        self._check()
        if count <= 0:
            return 0
        if start < 0 or (start + count) * TABLE_WORDS > table.shape[0] or ring == 0:
            raise ValueError("records outside the table")
        if count > MAX_STACK_WRS:
            _heap_chain(count, &wrs, &sges)
        try:
            memset(wrs, 0, count * sizeof(ibv_send_wr))
            for i in range(count):
                r = (start + i) * TABLE_WORDS
                word = table[r + LENGTH_LKEY]
                sges[i] = ibv_sge(addr=table[r + LOCAL_ADDR], length=<uint32_t>(word & 0xffffffffu),
                                  lkey=<uint32_t>(word >> 32))
                wrs[i].wr_id = first_id + <uint64_t>(start + i) % ring
                wrs[i].opcode = opcode
                wrs[i].sg_list = &sges[i]
                wrs[i].num_sge = 1
                wrs[i].wr.rdma.remote_addr = table[r + REMOTE_ADDR]
                wrs[i].wr.rdma.rkey = <uint32_t>(table[r + RKEY_TAG] & 0xffffffffu)
                wrs[i].next = &wrs[i + 1] if i + 1 < count else NULL
            wrs[count - 1].send_flags = SEND_SIGNALED
            return self._sent(ibv_post_send(self.qp, wrs, &bad), count, wrs, bad)
        finally:
            if wrs != stack_wrs:
                free(wrs)
                free(sges)

    def post_recv(self, uint64_t wr_id, uint64_t addr, uint32_t length, uint32_t lkey):
        """Post one receive into one buffer (the message channel's packets);
        0 or the provider's errno."""
        cdef ibv_recv_wr wr
        cdef ibv_sge sge
        cdef ibv_recv_wr *bad = NULL
        self._check()
        _one_recv(&wr, &sge, wr_id, addr, length, lkey)
        return self._received(ibv_post_recv(self.qp, &wr, &bad), 1, &wr, bad)

    def post_recvs(self, list requests):
        """Post ``(wr_id, segments)`` receives as one linked list; 0 or errno."""
        cdef Py_ssize_t count = len(requests)
        cdef Py_ssize_t i
        cdef ibv_recv_wr stack_wrs[MAX_STACK_WRS]
        cdef _Scatter scatter = _Scatter(requests, 1)
        cdef ibv_recv_wr *wrs = stack_wrs
        cdef ibv_recv_wr *bad = NULL
        self._check()
        if count == 0:
            return 0
        if count > MAX_STACK_WRS:
            wrs = <ibv_recv_wr *>malloc(count * sizeof(ibv_recv_wr))
            if wrs == NULL:
                raise MemoryError()
        try:
            for i in range(count):
                request = requests[i]
                wrs[i].wr_id = request[0]
                wrs[i].num_sge = scatter.fill(request[1], &wrs[i].sg_list)
                wrs[i].next = &wrs[i + 1] if i + 1 < count else NULL
            return self._received(ibv_post_recv(self.qp, wrs, &bad), count, wrs, bad)
        finally:
            if wrs != stack_wrs:
                free(wrs)


cdef class SRQDriver:
    """Posts receives on one pyverbs SRQ, whose handle a found QP gave
    (:attr:`QPDriver.srq_address`); its owner calls :meth:`detach` before
    destroying the SRQ."""

    cdef ibv_srq *srq
    cdef public unsigned long long receives
    """Receives posted."""

    def __cinit__(self, uintptr_t address):
        self.srq = <ibv_srq *>address
        self.receives = 0

    @property
    def compiled(self):
        return True

    def detach(self):
        """Stop using the SRQ (before pyverbs destroys it)."""
        self.srq = NULL

    def post_recv(self, uint64_t wr_id, uint64_t addr, uint32_t length, uint32_t lkey):
        """Post one receive into one buffer; 0 or the provider's errno."""
        cdef ibv_recv_wr wr
        cdef ibv_sge sge
        cdef ibv_recv_wr *bad = NULL
        cdef int rc
        if self.srq == NULL:
            raise ValueError("the shared receive queue driver was detached")
        _one_recv(&wr, &sge, wr_id, addr, length, lkey)
        rc = ibv_post_srq_recv(self.srq, &wr, &bad)
        if rc == 0:
            self.receives += 1
        return rc
