"""Layer 2: connections made by rdma_cm.

:class:`~aiordma.cm.connection.Connection` (a cm_id with one of our queue
pairs), how each side is set up (``options``: one checked value each),
the active side (``connect``), the passive side (``server``), the
authentication handshake's messages (``auth``), on :mod:`aiordma.verbs`.
"""
