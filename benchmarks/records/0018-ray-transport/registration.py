"""What a repeated export costs with and without a shared registration (record 0018).

    aiordma lab -- .venv/bin/python benchmarks/records/0018-ray-transport/registration.py

For 1 MiB and 64 MiB: the time of ``ArrayEngine.export`` of an array that
is exported already by a live object (shared registration) beside one that
is not (a fresh registration: ``reuse=False``), and the time of a fetch's
landing registration (a fresh ``numpy.empty`` registered, then unregistered),
medians of 9, in one process on the lab device.
"""

from __future__ import annotations

import statistics
import time

import numpy

from aiordma.ray import ArrayEngine

MIB = 1 << 20


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def main() -> None:
    for reuse in (True, False):
        engine = ArrayEngine(reuse=reuse)
        try:
            for size in (MIB, 64 * MIB):
                array = numpy.ones(size, numpy.uint8)
                engine.export("held", [array])  # a live object holding the memory
                times = []
                for i in range(9):
                    begin = time.perf_counter()
                    engine.export(f"again-{i}", [array])
                    times.append(time.perf_counter() - begin)
                for i in range(9):
                    engine.free(f"again-{i}")
                engine.free("held")
                print(f"export of {size // MIB:>2} MiB again, reuse={reuse}: "
                      f"{median_ms(times):7.2f} ms", flush=True)  # fmt: skip
        finally:
            engine.close()
    engine = ArrayEngine()
    try:
        for size in (MIB, 64 * MIB):
            times = []
            for i in range(9):
                begin = time.perf_counter()
                engine.export(f"fresh-{i}", [numpy.empty(size, numpy.uint8)])
                engine.free(f"fresh-{i}")
                times.append(time.perf_counter() - begin)
            print(f"register + unregister of a fresh {size // MIB:>2} MiB buffer: "
                  f"{median_ms(times):7.2f} ms", flush=True)  # fmt: skip
    finally:
        engine.close()


if __name__ == "__main__":
    main()
