#!/usr/bin/env bash
# One GPU call: per-kernel times of the weak normalization rows (torch profiler), optionally
# their Nsight Compute sections (NCU=1), then reduction knob sweeps (tools/knob_sweep.sh).
#   OUT=dir [NCU=1] [ROWS="sum(-1),softmax 8192"] bash tools/gpu_reduction_probe.sh [SWEEP ...]
# where each SWEEP is "rows|setting;setting;..." (a setting: space-separated VAR=value).
export PYTHONPATH=. PYFUSER_CACHE_DIR=/tmp/pf_probe_cache
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
ROWS="${ROWS:-sum(-1),sum(0),var_mean,softmax 8192,softmax 1024,cross_entropy,layer_norm 1024,batch_norm}"
python3 tools/profile_reduction_rows.py --only "$ROWS" --calls 2 2>&1 | grep -v Warn | tee "$OUT/kernel_times.txt"
if [ "${NCU:-0}" = 1 ]; then
    timeout ${NCU_S:-180} ncu --clock-control none -k regex:pf_ --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --csv --page details \
        python3 tools/profile_reduction_rows.py --only "$ROWS" --calls 1 --no-timing > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
    echo "ncu rc=$? lines=$(wc -l < "$OUT/ncu.csv")"
fi
n=0
for sweep in "$@"; do
    rows="${sweep%%|*}"; IFS=';' read -ra settings <<< "${sweep#*|}"
    n=$((n + 1))
    bash tools/knob_sweep.sh "$rows" "${settings[@]}" 2>&1 | tee "$OUT/sweep_$n.txt"
done
