#!/usr/bin/env bash
# The GPU test suite in N shards run at once on one GPU (a 1200-test suite: ~175 s on an H200
# with 6 shards, against 420 s and more in one process: most of a test's time is the host's).
#   PYTHONPATH=. bash tools/gpu_suite.sh [shards, default 6] [extra pytest args...]
# Collects the GPU tests' ids, deals them round-robin to the shards, runs each shard in its own
# pytest process (output in ${OUT:-/tmp}/gpu_shard<k>.txt) and prints each shard's summary, then
# every failure and error. Exit status: 0 when every shard's pytest exited with 0 (each shard's
# own exit status is the last line of its output: a crash at exit after a green summary shows).
set -u
shards="${1:-6}"
shift || true
out="${OUT:-/tmp}"
"${PYTHON:-python3}" -m pyfuser.runtime.native > /dev/null 2>&1     # built once, before the shards start
ids="$out/gpu_ids.txt"
"${PYTHON:-python3}" -m pytest tests -m gpu --collect-only -q -o addopts="" -p no:cacheprovider 2>/dev/null \
    | grep "::" > "$ids"
echo "$(wc -l < "$ids") GPU tests in $shards shards"
pids=()
for ((k = 0; k < shards; k++)); do
    awk -v k="$k" -v n="$shards" '(NR - 1) % n == k' "$ids" > "$out/gpu_shard$k.ids"
    (mapfile -t mine < "$out/gpu_shard$k.ids"
     "${PYTHON:-python3}" -m pytest "${mine[@]}" -m gpu -rfEs -p no:cacheprovider -o addopts="" -q "$@" \
         > "$out/gpu_shard$k.txt" 2>&1; echo "exit status $?" >> "$out/gpu_shard$k.txt") &
    pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p"; done
for ((k = 0; k < shards; k++)); do
    echo "== shard $k: $(tail -2 "$out/gpu_shard$k.txt" | tr '\n' ' ')"
    grep -q "^exit status 0$" "$out/gpu_shard$k.txt" || status=1
done
grep -h "^FAILED\|^ERROR" "$out"/gpu_shard*.txt
exit $status
