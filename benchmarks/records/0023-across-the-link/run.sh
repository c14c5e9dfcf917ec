#!/bin/sh
# Issue 64, one two-host boot: ib_read_bw 10 of 10 at 64 KiB and 1 MiB (rxe counters on
# both hosts), then the engines across the link with perftest and TCP beside, each row with
# both hosts' link counters, then Ray's pulls (placement and counters printed).
#   aiordma lab --hosts 2 -- sh benchmarks/records/0023-across-the-link/run.sh
cd /work/main || exit 1
P=.venv/bin/python
B=".venv/bin/aiordma bench --remote --loop uvloop"
echo "=== ib_read_bw x 10 and ib_write_bw x 2 per size"
$P benchmarks/records/0020-lab-link/link.py 10
echo "=== one-sided transfers and the message stream, 8 s each"
$B xfer_read xfer_write msg_bw --sizes 65536,1048576 --duration 8 --compare perftest --compare tcp
echo "=== rpc_fetch, 8 s each"
$B rpc_fetch --sizes 65536,1048576 --duration 8 --compare tcp
echo "=== Ray: producer on host 2, consumer on host 1"
.venv/bin/python -m benchmarks ray_transfer --sizes 1 16 64 --rounds 3 --idle 2
