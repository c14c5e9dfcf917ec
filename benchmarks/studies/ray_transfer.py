"""Ray actor to actor: an array through aiordma's transport beside Ray's object store.

    aiordma lab [--hosts 2] -- python -m benchmarks ray_transfer [--sizes MIB...]
        [--rounds N] [--idle S]

Starts a Ray head here (the lab's helper), a producer and a consumer actor
(in the two-host lab: a second Ray node on host 2, the producer there and
the consumer here, so both paths cross the link: it prints where each
actor runs, and both hosts' link counters around each size's pulls),
and for each size (1 and 64 MiB by default) times ``--rounds`` pulls of one
array by the consumer, made by the producer's method with
``tensor_transport="AIORDMA"`` (one-sided RDMA READ) and with Ray's default
(the object store), as the driver sees them: ``ray.get`` of the consumer's
call on a ready reference, less the same call on a tiny array. Then, with
the registered objects still held, it reads each actor process's CPU time
over ``--idle`` seconds, as the actor reads it (whole process and aiordma's
loop thread alone), and ends with ``ib_read_bw`` on the same path (to host 2
when there is one) for the reference rate: at the sizes pulled on one host,
at 64 KiB (what the agents post) across the link.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from aiordma.bench import perftest
from aiordma.bench.command import remote_starter
from aiordma.channel.sizing import READ_PIECE
from aiordma.lab.ray_head import start_head, stop_head
from aiordma.lab.remote import Fabric
from benchmarks import lab_address

MIB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """A process's (or one of its threads') user + system CPU time."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def own_cpu() -> tuple[float, float]:
    """This process's CPU seconds, and those of its aiordma loop thread (0 if none)."""
    import aiordma.ray

    manager = aiordma.ray.current_manager()
    tid = None if manager is None else manager.engine.thread_id
    return cpu_seconds(os.getpid()), 0.0 if tid is None else cpu_seconds(os.getpid(), tid)


def on_host2(fabric: Fabric, *args: str) -> str:
    """Run ``python -m aiordma.lab.ray_head ARGS`` on host 2; its output."""
    rc, out = asyncio.run(fabric.run([sys.executable, "-m", "aiordma.lab.ray_head", *args]))
    if rc != 0:
        raise SystemExit(f"ray_head {' '.join(args)} failed on host 2:\n{out}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks ray_transfer")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64], help="MiB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU reading")
    parser.add_argument("--reference-kib", type=int, nargs="+",
                        help="ib_read_bw's message sizes (default: the sizes; across the "
                        "link 64 KiB, the READ the agent posts there)")  # fmt: skip
    parser.add_argument("--device", default=os.environ.get("AIORDMA_DEVICE", "rxe0"))
    args = parser.parse_args()
    addr = lab_address()
    fabric = Fabric.from_environment()

    started = time.monotonic()
    import numpy as np
    import ray

    import aiordma.ray

    print(f"import ray and aiordma.ray: {time.monotonic() - started:.1f} s", flush=True)
    if fabric is None:
        head = start_head(num_cpus=4)
    else:
        head = start_head(num_cpus=4, node_ip=fabric.addr, resources={"host1": 4})
    print(f"ray start --head: {head.seconds:.1f} s", flush=True)
    if fabric is not None:
        joined = on_host2(fabric, "join", head.address, "--node-ip", fabric.peer_addr,
                          "--num-cpus", "4", "--resources", json.dumps({"host2": 4}))  # fmt: skip
        print(joined.strip(), flush=True)
    actor: Any = ray.remote  # Ray's annotations lack enable_tensor_transport
    aiordma.ray.register()  # before the classes: ray.method checks the transport's name

    class Producer:
        def __init__(self) -> None:
            self.data: dict[int, Any] = {}

        def cpu(self) -> tuple[float, float]:
            return own_cpu()

        def node(self) -> str:
            return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

        def _array(self, size: int) -> Any:
            if size not in self.data:
                self.data[size] = np.random.default_rng(size).integers(0, 256, size, np.uint8)
            return self.data[size]

        @ray.method(tensor_transport="AIORDMA")
        def rdt(self, size: int) -> Any:
            return self._array(size)

        def store(self, size: int) -> Any:
            return self._array(size)

    class Consumer:
        def cpu(self) -> tuple[float, float]:
            return own_cpu()

        def node(self) -> str:
            return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

        def touch(self, array: Any) -> int:
            return int(array.nbytes)

    try:
        ray.init(address=head.address)
        there = {} if fabric is None else {"resources": {"host2": 1}}
        here = {} if fabric is None else {"resources": {"host1": 1}}
        producer = actor(enable_tensor_transport=True)(Producer).options(**there).remote()
        consumer = actor(enable_tensor_transport=True)(Consumer).options(**here).remote()
        tiny = np.zeros(8, np.uint8)
        ray.get(consumer.touch.remote(tiny))
        made_on, used_on = ray.get([producer.node.remote(), consumer.node.remote()])
        print(f"producer on {made_on}, consumer on {used_on}", flush=True)
        if fabric is not None and made_on == used_on:
            raise SystemExit("ray_transfer: the producer and the consumer share a node: "
                             "nothing would cross the link")  # fmt: skip

        def timed(ref: Any) -> float:
            # Ready, but left where it was made: by default ray.wait also
            # pulls the object to the driver's node (here the consumer's),
            # and the timed call then moved nothing across the link.
            ray.wait([ref], fetch_local=False)
            begin = time.perf_counter()
            ray.get(consumer.touch.remote(ref))
            return time.perf_counter() - begin

        base = statistics.median(timed(ray.put(tiny)) for _ in range(args.rounds))
        held = []
        floor = f"(call floor {base * 1e3:.1f} ms)"
        print(f"{'size':>8} {'path':>12} {'median s':>9} {'MB/s':>8} {'less floor':>10}  {floor}")
        for mib in args.sizes:
            size = mib * MIB
            for path, method in (("AIORDMA", producer.rdt), ("object store", producer.store)):
                ray.get(consumer.touch.remote(method.remote(size)))  # warm: connections, pages
                times = []
                counted = None if fabric is None else asyncio.run(fabric.link_bytes())
                for _ in range(args.rounds):
                    ref = method.remote(size)
                    times.append(timed(ref))
                    if path == "AIORDMA":
                        held.append(ref)
                took = statistics.median(times)
                less = f"{size / (took - base) / 1e6:.1f}" if took > base else "(at floor)"
                print(f"{mib:>5} MiB {path:>12} {took:>9.3f} {size / took / 1e6:>8.1f} {less:>10}",
                      flush=True)  # fmt: skip
                if fabric is not None and counted is not None:
                    moved = asyncio.run(fabric.link_bytes()).since(counted)
                    print(f"{'':>8} {'':>12} {moved.describe(size * args.rounds)}", flush=True)

        before = ray.get([producer.cpu.remote(), consumer.cpu.remote()])
        time.sleep(args.idle)  # measuring idleness: nothing may run meanwhile
        after = ray.get([producer.cpu.remote(), consumer.cpu.remote()])
        for name, b, a in zip(("producer", "consumer"), before, after, strict=True):
            print(f"idle CPU, {name} (holding {len(held)} exported objects): process "
                  f"{(a[0] - b[0]) / args.idle:.1%} of a core, aiordma loop thread "
                  f"{(a[1] - b[1]) / args.idle:.1%}", flush=True)  # fmt: skip
        del held
    finally:
        ray.shutdown()
        stop_head()
        if fabric is not None:
            on_host2(fabric, "stop")
    target = addr
    starter: Callable[[list[str]], Callable[[], None]] = perftest.start_local
    if fabric is not None:
        target, starter = fabric.peer_addr, remote_starter(fabric)
    references = [mib * MIB for mib in args.sizes]
    if args.reference_kib:
        references = [kib << 10 for kib in args.reference_kib]
    elif fabric is not None:
        references = [READ_PIECE]  # a 1 MiB READ (1,024 packets) hangs on the lab's link
    for size in references:
        result = perftest.run("read_bw", args.device, target, size,
                              max(5, 256 * MIB // size // 4), 1, start_server=starter)  # fmt: skip
        rate = "unavailable" if result is None else f"{result.mb_per_s:.1f} MB/s"
        print(f"ib_read_bw {size >> 10} KiB (same boot): {rate}", flush=True)


if __name__ == "__main__":
    main()
