#!/usr/bin/env bash
# llama-sparse: waits until the machine's cores were >= 95 % idle over a 3 s window (at most 15 min), then
# prints the uptime line; run before a timed benchmark on the shared machine (bench/results/gemv_cpu_fair_*.md)
for i in $(seq 1 300); do
  a=($(head -1 /proc/stat)); sleep 3; b=($(head -1 /proc/stat))
  tot=0; for k in 1 2 3 4 5 6 7 8; do tot=$((tot + b[k] - a[k])); done
  idle=$(( (b[4]-a[4]) + (b[5]-a[5]) ))
  if [ $((idle*100)) -ge $((tot*95)) ]; then echo "idle ok after $((i*3))s: $(uptime)"; exit 0; fi
done
echo "never idle: $(uptime)"
