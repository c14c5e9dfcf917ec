"""The producer process of the Ray transport's lab tests: ``python -m tests.ray.producer``.

Arguments: ``[--exchange]``. It drives the transport as Ray drives it in a producer actor: on each
command line read from stdin it answers one line on stdout.

- ``export ID SEED SIZE...``: one object of arrays of SIZE bytes each
  (:func:`arrays`, seeded), extracted (``extract_tensor_transport_metadata``);
  answers ``meta HEX``, the pickled metadata (``--exchange``: the exchange's
  :class:`~aiordma.ray.Export`) as hex.
- ``free ID``: ``garbage_collect`` of the object; answers ``freed``.
- ``exported``: answers ``exported N``, the objects held now.
- ``exit``: closes the exchange and exits.

With ``--exchange`` it uses :class:`~aiordma.ray.ArrayExchange` without Ray (its
start takes seconds, not Ray's import); it prints ``ready`` first.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
from typing import Any

import numpy

DTYPES = ("<u1", "<f4", "<i8", ">u2")
"""The dtypes the arrays of an object take in turn (one big-endian)."""


def arrays(seed: int, sizes: list[int]) -> list[numpy.ndarray[Any, Any]]:
    """Seeded random arrays of ``sizes`` bytes, dtypes in turn; every third
    one with room for it is a non-contiguous view (copied by the transport)."""
    rng = numpy.random.default_rng(seed)
    out = []
    for i, size in enumerate(sizes):
        dtype = numpy.dtype(DTYPES[i % len(DTYPES)])
        count = size // dtype.itemsize
        raw = rng.integers(0, 256, size=count * dtype.itemsize, dtype=numpy.uint8)
        array = raw.view(dtype)
        if i % 3 == 2 and count >= 4 and count % 2 == 0:
            array = array.reshape(2, count // 2).T  # Fortran-ordered: not C-contiguous
        out.append(array)
    return out


def digests(values: list[numpy.ndarray[Any, Any]]) -> list[str]:
    """Each array's SHA-256, over its bytes in C order."""
    return [hashlib.sha256(numpy.ascontiguousarray(v).tobytes()).hexdigest() for v in values]


def main() -> None:
    exchange_only = "--exchange" in sys.argv
    if exchange_only:
        from aiordma.ray import ArrayExchange

        exchange = ArrayExchange()
        manager = None
        exchange.metadata  # noqa: B018  (starts it: the agent listens before "ready")
    else:
        from aiordma.ray import AiordmaTransport

        manager = AiordmaTransport()
        exchange = manager.exchange
    print("ready", flush=True)
    held: dict[str, list[numpy.ndarray[Any, Any]]] = {}
    metas: dict[str, Any] = {}
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "export":
            obj_id, seed, sizes = words[1], int(words[2]), [int(w) for w in words[3:]]
            held[obj_id] = values = arrays(seed, sizes)
            if manager is None:
                meta: Any = exchange.export(obj_id, values)
            else:
                meta = manager.extract_tensor_transport_metadata(obj_id, values)
            metas[obj_id] = meta
            print("meta", pickle.dumps(meta).hex(), flush=True)
        elif words[0] == "free":
            if manager is None:
                exchange.free(words[1])
            else:
                manager.garbage_collect(words[1], metas[words[1]], held[words[1]])
            held.pop(words[1], None)
            print("freed", flush=True)
        elif words[0] == "exported":
            print("exported", exchange.exported, flush=True)
        elif words[0] == "exit":
            break
    exchange.close()


if __name__ == "__main__":
    main()
