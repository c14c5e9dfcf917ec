#!/bin/sh
# Record 0022: drain_cpu.py twice in one boot (each: a 0.5 s warm-up run, then 5 s).
cd /work/main
for i in 1 2; do .venv/bin/python benchmarks/records/0022-stream-cost/drain_cpu.py; done
