#!/usr/bin/env bash
# The one-shot GPU run: GPU tests, then the benchmarks, logs under $OUT.
#   OUT=/some/dir bash bench/run_gpu_suite.sh      (SKIP_TESTS=1, BENCHES="views graphs": subsets;
#   BENCHES="" (set and empty): no benchmark)
# Keeps going when tests fail (the benchmark still runs); prints a summary and exits non-zero
# if anything failed.
set -x
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)"
export PYFUSER_CACHE_DIR="${PYFUSER_CACHE_DIR:-/tmp/pyfuser_cache_gpu_suite}"
PY="${PYTHON:-python3}"

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
$PY -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name()); import cuda.bindings; print('cuda-bindings', cuda.bindings.__version__)"

# The native cached-call runner is built once per machine, at install time (never on a call):
# build it here, and say if it failed.
$PY -c "
import logging, time; logging.basicConfig(level=logging.INFO)
t = time.perf_counter()
from pyfuser.runtime import native
m = native.build()
print('native runner:', 'built/loaded in %.1f s' % (time.perf_counter() - t) if m else 'UNAVAILABLE')
"

start=$(date +%s)
if [ "${SKIP_TESTS:-0}" = 1 ]; then
    echo "GPU tests skipped (SKIP_TESTS=1)" >"$OUT/gpu_tests.log"; tests_rc=0
else
    # in GPU_SHARDS (default 6) pytest processes at once on the one GPU (tools/gpu_suite.sh)
    OUT="$OUT" timeout ${TESTS_TIMEOUT:-400} bash tools/gpu_suite.sh "${GPU_SHARDS:-6}" \
        --maxfail=50 >"$OUT/gpu_tests.log" 2>&1
    tests_rc=$?
fi
tail -n 60 "$OUT/gpu_tests.log"
tests_s=$(( $(date +%s) - start ))

start=$(date +%s)
bench_rc=0
# BENCHES="views graphs" runs a subset (pointwise takes ~4 minutes: three timing methods);
# "pointwise_host" is pointwise.py --host-only (its host-overhead table alone); "host" is
# bench/host.py (call overhead and start-up: issue 14)
for b in ${BENCHES-pointwise views graphs host}; do
    args=""
    [ "$b" = pointwise_host ] && { b=pointwise; args="--host-only"; }
    limit=330
    [ "$b" = host ] && limit=480
    timeout $limit $PY bench/$b.py $args >"$OUT/bench_$b$args.log" 2>&1 || bench_rc=1
    tail -n 40 "$OUT/bench_$b$args.log"
done
bench_s=$(( $(date +%s) - start ))

set +x
echo "================ summary ================"
echo "gpu tests: rc=$tests_rc (${tests_s}s) -> $OUT/gpu_tests.log"
grep -E "^[0-9]+ (passed|failed)|passed|failed" "$OUT/gpu_tests.log" | tail -n 1
echo "benchmarks: rc=$bench_rc (${bench_s}s) -> $OUT/bench_*.log, $OUT/bench_*.md, plots $OUT/bench_*.svg (+ .json)"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
