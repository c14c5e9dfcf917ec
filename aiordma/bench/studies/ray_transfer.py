"""Ray actor to actor: an array through aiordma's transport beside Ray's object store.

    aiordma lab -- aiordma bench study ray_transfer [--sizes MIB...] [--rounds N] [--idle S]

Starts a Ray head here (the lab's helper), a producer and a consumer actor,
and for each size (1 and 64 MiB by default) times ``--rounds`` pulls of one
array by the consumer, made by the producer's method with
``tensor_transport="AIORDMA"`` (one-sided RDMA READ) and with Ray's default
(the object store), as the driver sees them: ``ray.get`` of the consumer's
call on a ready reference, less the same call on a tiny array. Then, with
the registered objects still held, it reads each actor process's CPU time
over ``--idle`` seconds (whole process and aiordma's loop thread alone) and
ends with ``ib_read_bw`` on the same device for the reference rate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from aiordma.bench import perftest
from aiordma.bench.studies import lab_address
from aiordma.lab.ray_head import start_head, stop_head

MIB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """A process's (or one of its threads') user + system CPU time."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main() -> None:
    parser = argparse.ArgumentParser(prog="aiordma bench study ray_transfer")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64], help="MiB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU reading")
    parser.add_argument("--device", default=os.environ.get("AIORDMA_DEVICE", "rxe0"))
    args = parser.parse_args()
    addr = lab_address()

    started = time.monotonic()
    import numpy as np
    import ray

    import aiordma.ray

    print(f"import ray and aiordma.ray: {time.monotonic() - started:.1f} s", flush=True)
    head = start_head(num_cpus=4)
    print(f"ray start --head: {head.seconds:.1f} s", flush=True)
    actor: Any = ray.remote  # Ray's annotations lack enable_tensor_transport
    aiordma.ray.register()  # before the classes: ray.method checks the transport's name

    class Producer:
        def __init__(self) -> None:
            self.data: dict[int, Any] = {}

        def pid(self) -> int:
            return os.getpid()

        def _array(self, size: int) -> Any:
            if size not in self.data:
                self.data[size] = np.random.default_rng(size).integers(0, 256, size, np.uint8)
            return self.data[size]

        @ray.method(tensor_transport="AIORDMA")
        def rdt(self, size: int) -> Any:
            return self._array(size)

        def store(self, size: int) -> Any:
            return self._array(size)

        def loop_thread(self) -> int | None:
            manager = aiordma.ray.current_manager()
            return None if manager is None else manager.engine.thread_id

    class Consumer:
        def pid(self) -> int:
            return os.getpid()

        def touch(self, array: Any) -> int:
            return int(array.nbytes)

        def loop_thread(self) -> int | None:
            manager = aiordma.ray.current_manager()
            return None if manager is None else manager.engine.thread_id

    try:
        ray.init(address=head.address)
        producer = actor(enable_tensor_transport=True)(Producer).remote()
        consumer = actor(enable_tensor_transport=True)(Consumer).remote()
        pids = ray.get([producer.pid.remote(), consumer.pid.remote()])
        tiny = np.zeros(8, np.uint8)
        ray.get(consumer.touch.remote(tiny))

        def timed(ref: Any) -> float:
            ray.wait([ref])
            begin = time.perf_counter()
            ray.get(consumer.touch.remote(ref))
            return time.perf_counter() - begin

        base = statistics.median(timed(ray.put(tiny)) for _ in range(args.rounds))
        held = []
        floor = f"(call floor {base * 1e3:.1f} ms)"
        print(f"{'size':>8} {'path':>12} {'median s':>9} {'MB/s':>8}  {floor}")
        for mib in args.sizes:
            size = mib * MIB
            for path, method in (("AIORDMA", producer.rdt), ("object store", producer.store)):
                ray.get(consumer.touch.remote(method.remote(size)))  # warm: connections, pages
                times = []
                for _ in range(args.rounds):
                    ref = method.remote(size)
                    times.append(timed(ref))
                    if path == "AIORDMA":
                        held.append(ref)
                took = statistics.median(times)
                rate = size / max(took - base, 1e-9) / 1e6
                print(f"{mib:>5} MiB {path:>12} {took:>9.3f} {rate:>8.1f}", flush=True)

        threads = ray.get([producer.loop_thread.remote(), consumer.loop_thread.remote()])
        before = [cpu_seconds(p) for p in pids]
        before_loop = [cpu_seconds(p, t) if t else 0.0 for p, t in zip(pids, threads, strict=True)]
        time.sleep(args.idle)  # measuring idleness: nothing may run meanwhile
        after = [cpu_seconds(p) for p in pids]
        after_loop = [cpu_seconds(p, t) if t else 0.0 for p, t in zip(pids, threads, strict=True)]
        for name, b, a, bl, al in zip(("producer", "consumer"), before, after, before_loop,
                                      after_loop, strict=True):  # fmt: skip
            print(f"idle CPU, {name} (holding {len(held)} exported objects): process "
                  f"{(a - b) / args.idle:.1%} of a core, aiordma loop thread "
                  f"{(al - bl) / args.idle:.1%}", flush=True)  # fmt: skip
        del held
    finally:
        ray.shutdown()
        stop_head()
    for mib in args.sizes:
        result = perftest.run("read_bw", args.device, addr, mib * MIB, max(4, 256 // mib), 1)
        rate = "unavailable" if result is None else f"{result.mb_per_s:.1f} MB/s"
        print(f"ib_read_bw {mib} MiB (same boot): {rate}", flush=True)


if __name__ == "__main__":
    main()
