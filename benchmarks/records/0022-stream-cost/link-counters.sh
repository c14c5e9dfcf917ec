#!/bin/sh
C=/sys/class/infiniband/rxe0/ports/1/hw_counters
snap() { for f in sent_pkts rcvd_pkts duplicate_request out_of_seq_request rcvd_seq_err ack_deferred retry_exceeded_err rcvd_rnr_err send_rnr_err completer_retry_err; do printf "%s=%s " $f $(cat $C/$f 2>/dev/null); done; echo; }
ls $C
# Issue 65: what host 1 (the sender, answering the reads) sent across the two-host link for
# msg_bw and xfer_read at 1 MiB, by rxe's hw_counters, to tell warm-up from retransmission.
# Run as: aiordma lab --hosts 2 -- sh benchmarks/records/0022-stream-cost/link-counters.sh
PY=/work/main/.venv/bin/python
for mode in msg_bw xfer_read; do
  echo "== $mode"; snap
  (cd /tmp && $PY -m aiordma bench --loop uvloop --remote $mode --sizes 1048576 --duration 5 2>&1 | grep "/s\|rror")
  snap
done
