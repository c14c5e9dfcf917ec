#!/bin/sh
# The share rule (the new auto) against the policy before it and off: a channel ping-pong as the
# tutorial writes it, both sides' counters. Before: git show 1d75eac:aiordma/verbs/_waiting.py > /tmp/old_waiting.py
cd /work/main
IP=$AIORDMA_ADDR
one() {
  echo "=== $1 $2"
  env $2 AIORDMA_POLL=$1 .venv/bin/python benchmarks/records/0019-waiting-policy/share-chan.py server $IP > /tmp/share-srv.out 2>&1 &
  for i in $(seq 150); do grep -q listening /tmp/share-srv.out && break; sleep 0.2; done
  env $2 AIORDMA_POLL=$1 timeout 300 .venv/bin/python benchmarks/records/0019-waiting-policy/share-chan.py client $IP || kill %1
  wait
  grep server /tmp/share-srv.out
}
for r in 1 2; do
  one auto OLDPOLICY=/tmp/old_waiting.py
  one auto NEW=1
  one off NEW=1
done
.venv/bin/aiordma bench --loop uvloop --sizes 64 --warmup 50 msg_lat --iterations 300 --compare tcp 2>&1 | grep "us "
