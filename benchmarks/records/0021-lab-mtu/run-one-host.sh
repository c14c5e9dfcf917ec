#!/bin/sh
# Record 0021: the one-host lab's rxe at the dummy card's old MTU (1500: RoCE MTU 1024) and at a
# jumbo one (9000: RoCE MTU 4096), alternated in one boot, perftest and TCP beside each run.
# Run as: aiordma lab -- sh benchmarks/records/0021-lab-mtu/run-one-host.sh
cd /work/main
B=".venv/bin/aiordma bench"
for r in 1 2; do
  for mtu in 1500 9000; do
    ip link set dummy0 mtu $mtu
    until ibv_devinfo -d rxe0 | grep -q "active_mtu:.*($(( mtu > 4200 ? 5 : 3 )))"; do sleep 0.1; done
    echo "=== round $r, dummy0 MTU $mtu ($(ibv_devinfo -d rxe0 | grep active_mtu | tr -s '\t ' ' '))"
    $B msg_bw write_bw read_bw --sizes 65536,1048576 --duration 4 --compare perftest --compare tcp 2>&1 | grep "MB/s"
    $B send_lat msg_lat --sizes 64 --iterations 300 --compare perftest --compare tcp 2>&1 | grep " us "
  done
done
