"""``aiordma bench``: aiordma's figures next to perftest's, on the same device, in one run.

Latency modes time one awaited operation at a time (post, then its
completion: a full round trip), and report p50, p99, p99.9 and the mean in
microseconds; perftest's one-way latency figures are doubled to match.
Bandwidth modes keep ``--depth`` operations in flight and report MB/s and
Gbit/s; ``send_rate`` keeps ``--depth`` sends in flight, posted as lists, and
reports messages per second. ``rpc_lat`` is an ``echo`` call; ``rpc_bw``
fetches results into registered memory with ``--depth`` calls in flight,
``rpc_fetch`` the same into a new buffer per call, and ``rpc_sink`` sends
payloads to a method that drops them. ``msg_lat`` is a ping-pong of
messages through :class:`~aiordma.MessageChannel`, passing plain ``bytes``
as users do; ``msg_bw`` streams them, ``--depth`` sends in flight, timed
until the peer acknowledges the last, and ``msg_into_bw`` the same into
one plain ``bytearray`` the peer reuses (``recv_message_into``), as a
server that keeps its buffer does; ``msg_rate`` streams small ones
with ``send_messages``, ``--depth`` a call, and the peer takes what has
arrived with ``recv_messages``; ``msg_reg_lat`` and ``msg_reg_bw``
do the same from and into registered memory. ``connect`` times rdma_cm connection
set-up (``connect()`` until established). ``--compare tcp`` runs each
pattern over asyncio TCP streams to the same address (see
:mod:`aiordma.bench.tcp`).

Modules: ``command`` (the command line), ``runner`` (the measurements),
``peer`` (the other process), ``perftest`` (the C reference), ``tcp`` (the
asyncio TCP baseline), ``stats``, ``report`` (table, progress), ``plot``.
"""
