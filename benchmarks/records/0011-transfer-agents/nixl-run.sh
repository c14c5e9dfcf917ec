#!/bin/sh
# In the lab guest: NIXL's reads, then aiordma's study, alternated.
cd /work/main
C=/sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts
for round in 1 2; do
  echo "== round $round: NIXL (rxe0 sent_pkts before: $(cat $C))"
  UCX_TLS=rc_v,self UCX_NET_DEVICES=rxe0:1 LD_LIBRARY_PATH=/work/nixlib timeout 600 /work/nixlenv/bin/python benchmarks/records/0011-transfer-agents/nixl_reads.py --rounds 5 2>&1 | grep -v " NIXL INFO "
  echo "== rxe0 sent_pkts after: $(cat $C)"
  echo "== round $round: aiordma"
  timeout 900 .venv/bin/python -m benchmarks transfers --rounds 5 --no-perftest 2>&1
done
echo "== perftest"
timeout 900 .venv/bin/python -m benchmarks transfers --rounds 5 2>&1 | grep "ib_"
