"""Issue 64: where RDMA READ bytes go across the two-host link, in one boot.

    aiordma lab --hosts 2 --link stream|dgram -- .venv/bin/python \
        benchmarks/records/0020-lab-link/link.py [TRIES]

For each size, ``TRIES`` runs of ``ib_read_bw`` (host 2 serves, host 1
reads; each bounded by a timeout: a hang shows as one), then one of
``ib_write_bw``; before and after each tool, rxe's counters and the
card's drop counters on both hosts. Prints one line per run and the
counters that moved.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

from aiordma.lab.remote import Fabric

COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"
READ = (
    f"cd {COUNTERS} && grep -H . * | tr '\\n' ' '; echo; "
    'for n in /sys/class/net/*; do [ "${n##*/}" = lo ] && continue; '
    "for f in rx_dropped tx_dropped rx_packets tx_packets; do "
    'printf \'%s.%s:%s \' "${n##*/}" "$f" "$(cat $n/statistics/$f)"; done; done; echo'
)
SIZES = (65536, 1 << 20)
TIMEOUT = 120.0


def parse(text: str) -> dict[str, int]:
    found = {}
    for name, value in re.findall(r"([\w.]+)[:](\d+)", text):
        found[name] = int(value)
    return found


def here() -> dict[str, int]:
    return parse(subprocess.run(["sh", "-c", READ], capture_output=True, text=True).stdout)


async def there(fabric: Fabric) -> dict[str, int]:
    _, out = await fabric.run(["sh", "-c", READ])
    return parse(out)


def moved(before: dict[str, int], after: dict[str, int]) -> str:
    return " ".join(f"{k}+{after[k] - before.get(k, 0)}" for k in sorted(after)
                    if after[k] != before.get(k, 0))  # fmt: skip


async def one(fabric: Fabric, tool: str, size: int, port: int) -> str:
    iterations = max(20, (64 << 20) // size // 4)
    base = [tool, "-d", "rxe0", "-R", "-F", "-s", str(size), "-n", str(iterations),
            "-p", str(port)]  # fmt: skip
    server = fabric.start(["timeout", str(int(TIMEOUT + 30)), *base])
    await asyncio.sleep(4.0)
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *base, fabric.peer_addr, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return f"{tool} {size}: HUNG (no result in {TIMEOUT:.0f} s)"
        took = time.monotonic() - started
        rows = [r for r in out.decode().splitlines() if re.match(r"\s*\d+\s+\d+", r)]
        if proc.returncode != 0 or not rows:
            return f"{tool} {size}: FAILED rc={proc.returncode} {out.decode()[-300:]!r}"
        fields = rows[-1].split()
        return f"{tool} {size}: {fields[3]} MB/s avg ({iterations} x {size} B in {took:.1f} s)"
    finally:
        await server.stop(grace=2.0)


async def main() -> None:
    tries = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    fabric = Fabric.from_environment()
    assert fabric is not None, "run me on host 1 of the two-host lab"
    await fabric.wait_for_peer()
    port = 18600
    for size in SIZES:
        for tool, count in (("ib_read_bw", tries), ("ib_write_bw", 2)):
            b1, b2 = here(), await there(fabric)
            for _ in range(count):
                port += 1
                print(await one(fabric, tool, size, port), flush=True)
            a1, a2 = here(), await there(fabric)
            print(f"  host 1 counters: {moved(b1, a1)}")
            print(f"  host 2 counters: {moved(b2, a2)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
