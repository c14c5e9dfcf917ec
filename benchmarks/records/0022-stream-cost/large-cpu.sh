#!/bin/sh
# Record 0022, "What bounds a stream of 1 MiB messages": the CPU a 1 MiB message costs.
# perftest's ib_write_bw and ib_read_bw (busy-polling and -e), 300 messages eight in flight,
# the client's user and kernel time from time(1); then stream_cpu.py at 1 MiB twice (eight
# send_message tasks in flight; the server takes them with recv_message_into one bytearray,
# which the channel keeps registered from the second message on).
# Run as: aiordma lab -- sh benchmarks/records/0022-stream-cost/large-cpu.sh
cd /tmp
for tool in ib_write_bw ib_read_bw; do
  for e in "" "-e"; do
    $tool -d rxe0 -R -F -s 1048576 -n 300 -t 8 $e -p 18515 > /dev/null 2>&1 &
    S=$!
    sleep 2
    /usr/bin/time -f "client %U user %S sys %e wall" $tool -d rxe0 -R -F -s 1048576 -n 300 -t 8 $e -p 18515 192.0.2.1 2>&1 | grep -E "^ 1048576|client"
    wait $S
    echo "$tool $e (300 msgs)"
  done
done
for i in 1 2; do
  SIZE=1048576 /work/main/.venv/bin/python /work/main/benchmarks/records/0022-stream-cost/stream_cpu.py
done
