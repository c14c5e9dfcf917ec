"""Ray actors hand numpy arrays to each other by RDMA READ, through aiordma.

    aiordma lab -- .venv/bin/python examples/ray_transfer.py [--address HOST:PORT]
                   [--sizes KIB...] [--auth]

Without ``--address`` it starts a Ray head on this machine first (the lab's
helper, which gets Ray's raylet past its slow dashboard agent in a guest)
and stops it at the end. A producer actor returns arrays of seeded random
bytes from a method marked ``tensor_transport="AIORDMA"``; a consumer actor
and this driver each pull them straight from the producer's memory and check
their SHA-256. rxe0's packet counters show the bytes went over RDMA. Once the
references are gone the producer's registrations end; a consumer asked for
an array of a killed producer, once its process has exited, fails with Ray's
error instead of hanging.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any

import numpy as np

T0 = time.monotonic()
import ray  # noqa: E402  (timed: importing Ray takes seconds in a guest)

import aiordma.ray  # noqa: E402
from aiordma.lab.ray_head import start_head, stop_head  # noqa: E402

IMPORTED = time.monotonic() - T0
# Ray's annotations do not list its alpha enable_tensor_transport option yet.
actor: Any = ray.remote
COUNTERS = "/sys/class/infiniband/{}/ports/1/hw_counters"


def blob(seed: int, size: int) -> np.ndarray[Any, Any]:
    """``size`` seeded random bytes."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def digest(array: np.ndarray[Any, Any]) -> str:
    return hashlib.sha256(array.tobytes()).hexdigest()


def actors() -> tuple[Any, Any]:
    """The producer and consumer actor classes. Made after :func:`aiordma.ray.register`:
    ``@ray.method(tensor_transport=...)`` checks the name when the class is defined."""

    class Producer:
        @ray.method(tensor_transport="AIORDMA")
        def make(self, seed: int, size: int) -> np.ndarray[Any, Any]:
            return blob(seed, size)

        def process(self) -> tuple[str, int]:
            """This actor's node and process id."""
            return ray.get_runtime_context().get_node_id(), os.getpid()

        def exported(self) -> int:
            """Objects whose arrays this actor's transport still holds registered."""
            manager = aiordma.ray.current_manager()
            return 0 if manager is None else manager.engine.exported

    class Consumer:
        def digest(self, array: np.ndarray[Any, Any]) -> str:
            return digest(array)

    # Both sides of a transfer must allow tensor transports.
    return (
        actor(enable_tensor_transport=True)(Producer),
        actor(enable_tensor_transport=True)(Consumer),
    )


def packets(device: str) -> int:
    """rxe's received-packet counter (every RDMA READ response packet counts)."""
    with open(os.path.join(COUNTERS.format(device), "rcvd_pkts")) as f:
        return int(f.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", help="a running Ray cluster (default: start a head here)")
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1, 1024, 16384, 65536],
        help="array sizes in KiB (default: 1 KiB, 1, 16 and 64 MiB)",
    )
    parser.add_argument("--auth", action="store_true", help="authenticate the agents' connections")
    parser.add_argument("--device", default=os.environ.get("AIORDMA_DEVICE", "rxe0"))
    args = parser.parse_args()
    print(f"import ray and aiordma.ray: {IMPORTED:.1f} s", flush=True)

    address = args.address
    if address is None:
        head = start_head(num_cpus=4)
        address = head.address
        print(f"ray start --head: {head.seconds:.1f} s", flush=True)
    try:
        started = time.monotonic()
        ray.init(address=address)
        print(f"ray.init: {time.monotonic() - started:.1f} s", flush=True)
        # before the actors are defined and made: they learn the transport from this process
        aiordma.ray.register(auth=os.urandom(32) if args.auth else None)
        producer_actor, consumer_actor = actors()
        started = time.monotonic()
        producer, consumer = producer_actor.remote(), consumer_actor.remote()
        ray.get([producer.exported.remote(), consumer.digest.remote(blob(0, 1))])
        print(f"two actors up: {time.monotonic() - started:.1f} s", flush=True)

        before = packets(args.device)
        moved = 0
        refs = []
        for seed, kib in enumerate(args.sizes, start=1):
            size = kib << 10
            ref = producer.make.remote(seed, size)
            started = time.monotonic()
            by_consumer = ray.get(consumer.digest.remote(ref))
            took = time.monotonic() - started
            by_driver = digest(ray.get(ref))
            expected = digest(blob(seed, size))
            ok = by_consumer == by_driver == expected
            print(
                f"{kib} KiB: consumer {'ok' if by_consumer == expected else 'WRONG'}, "
                f"driver {'ok' if by_driver == expected else 'WRONG'} ({took:.2f} s)",
                flush=True,
            )
            if not ok:
                raise SystemExit(1)
            moved += 2 * size  # the consumer's read and the driver's
            refs.append(ref)
        received = packets(args.device) - before
        print(f"rxe packets received: {received} for {moved} bytes read", flush=True)

        held = ray.get(producer.exported.remote())
        del ref, refs
        deadline = time.monotonic() + 120
        while (now := ray.get(producer.exported.remote())) and time.monotonic() < deadline:
            time.sleep(0.2)  # Ray frees objects asynchronously: wait for it, bounded
        print(f"registrations held: {held} while referenced, {now} once freed", flush=True)

        ref = producer.make.remote(99, 1 << 20)
        node, pid = ray.get(producer.process.remote())
        ray.get(producer.exported.remote())  # made and exported
        ray.kill(producer)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # ray.kill is asynchronous: wait until it is gone
            try:
                ray.get(producer.exported.remote(), timeout=60)
            except ray.exceptions.RayActorError:
                break
            time.sleep(0.2)
        # Ray reports the actor dead before its process has exited, and until
        # then its memory is still registered: wait for the process itself.
        if node == ray.get_runtime_context().get_node_id():
            reported = time.monotonic()
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.2)
            print(f"producer process gone {time.monotonic() - reported:.1f} s after Ray "
                  "reported the actor dead", flush=True)  # fmt: skip
        try:
            ray.get(consumer.digest.remote(ref), timeout=120)
        except ray.exceptions.RayError as error:
            print(f"killed producer: {type(error).__name__}", flush=True)
        else:
            print("killed producer: the read succeeded?", flush=True)
            raise SystemExit(1)
    finally:
        ray.shutdown()
        if args.address is None:
            stop_head()  # (a late stop is a warning: the run's result stands)


if __name__ == "__main__":
    main()
