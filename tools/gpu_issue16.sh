#!/usr/bin/env bash
# Issue 16 on one GPU: the torch.compile backend's GPU tests (the channels-last pass's own:
# `pytest -s tests/gpu/test_channels_last_gpu.py`, which prints its kernel counts and times), a
# profile of ResNet-18 with the pass off and on (PROFILE=1; 2 x PROFILE_TIMEOUT, 120 s, more:
# then SKIP_TESTS=1 or a smaller BENCH_BUDGET keeps it under 10 minutes), then bench/models.py
# (eager vs Inductor vs pyfuser, forward and training step, compile times); all under $OUT.
#   OUT=/some/dir bash tools/gpu_issue16.sh
#   SKIP_TESTS=1 BENCH_ARGS="--dtypes bfloat16 --no-compile-times" bash tools/gpu_issue16.sh
# At most 9 minutes (typically 6-8 on an H100): the native runner's build (install step, at
# most 120 s), the tests (TESTS_TIMEOUT, 150 s), the benchmark (BENCH_BUDGET 200 s: no new row
# after it, the rows left say "not run: time budget"; float32 rows come first; BENCH_TIMEOUT
# 280 s). Keeps going when the tests fail; exits non-zero if anything failed.
set -x
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)"
export PYFUSER_CACHE_DIR="${PYFUSER_CACHE_DIR:-/tmp/pyfuser_cache_issue16}"
PY="${PYTHON:-python3}"

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(), 'transformers', transformers.__version__)"
timeout 120 $PY -c "
import time; t = time.perf_counter()
from pyfuser.runtime import native
print('native runner:', 'built/loaded in %.1f s' % (time.perf_counter() - t) if native.build() else 'UNAVAILABLE')
"

tests_rc=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    timeout "${TESTS_TIMEOUT:-150}" $PY -m pytest tests/gpu/test_compile_gpu.py -q -rfEs \
        -p no:cacheprovider -W ignore >"$OUT/gpu_tests_issue16.log" 2>&1
    tests_rc=$?
    tail -n 40 "$OUT/gpu_tests_issue16.log"
fi

# the channels-last pass (PYFUSER_CHANNELS_LAST): ResNet-18 eval forward and training step
# kernel by kernel, pass off / forced on, beside eager and Inductor
if [ "${PROFILE:-0}" = 1 ]; then
    for step in forward train; do
        timeout "${PROFILE_TIMEOUT:-120}" $PY tools/profile_models.py --model resnet18 \
            --modes eager,inductor,pyfuser_nchw,pyfuser_nhwc,pyfuser_nhwc_split --step $step \
            --top 15 \
            >"$OUT/profile_resnet18_$step.log" 2>&1
        grep "^==" "$OUT/profile_resnet18_$step.log"
    done
fi

timeout "${BENCH_TIMEOUT:-280}" $PY bench/models.py --budget "${BENCH_BUDGET:-200}" --out "$OUT" \
    ${BENCH_ARGS:-} >"$OUT/bench_models.log" 2>&1
bench_rc=$?
tail -n 45 "$OUT/bench_models.log"

set +x
echo "gpu tests: rc=$tests_rc -> $OUT/gpu_tests_issue16.log"
echo "bench/models.py: rc=$bench_rc -> $OUT/bench_models.{log,md,json}, $OUT/bench_models_speed.svg"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
