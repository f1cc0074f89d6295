#!/usr/bin/env bash
# Issue 18 on one GPU (about 3 minutes on an H100), logs and tables under $OUT:
#   OUT=/some/dir bash tools/gpu_issue18.sh
# 1. tests/gpu/test_distributed_gpu.py: 4 processes compile the same fusions on cuda:0 into one
#    fresh cache (one NVRTC compile per kernel), 2 gloo DDP ranks sharing cuda:0 train through
#    pyfuser.jit (and the pyfuser torch.compile backend where it is importable) and equal one
#    process; the NCCL two-GPU tests skip on one GPU.
# 2. bench/distributed.py under torchrun with one rank (NCCL): DDP and FSDP2, BERT and Llama,
#    eager / pyfuser / pyfuser.jit, then Inductor for DDP, at a reduced size; the table is
#    $OUT/distributed/distributed.md (JSON beside it). On N GPUs run the same with
#    NPROC=N (and again with NPROC=1 into the same OUT for the scaling column).
# On a host with several GPUs, every world size in one directory (the scaling column), all cases
# in one torchrun per world, the tests skipped where an earlier call ran them:
#   OUT=... NPROCS="4" BENCH=all bash tools/gpu_issue18.sh
#   OUT=... NPROCS="2 1" BENCH=all TESTS=0 bash tools/gpu_issue18.sh
set -x
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT/distributed"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)"
export PYFUSER_PROGRESS=plain
PY="${PYTHON:-python3}"
NPROCS="${NPROCS:-${NPROC:-1}}"
TESTS="${TESTS:-1}"
BENCH="${BENCH:-short}"
SIZE="${SIZE:-8,256,512,2}"
nvidia-smi --query-gpu=name,memory.total --format=csv
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.device_count(), 'GPU(s)')"

tests_rc=0
if [ "$TESTS" = 1 ]; then
    start=$(date +%s)
    timeout 150 $PY -m pytest tests/gpu/test_distributed_gpu.py -rfEs -p no:cacheprovider \
        >"$OUT/gpu_distributed_tests.log" 2>&1
    tests_rc=$?
    tail -n 30 "$OUT/gpu_distributed_tests.log"
    echo "tests: rc=$tests_rc, $(( $(date +%s) - start )) s"
fi

start=$(date +%s)
bench() {   # one bench/distributed.py run; its rows join the table in $OUT/distributed
    timeout "$1" $PY -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
        bench/distributed.py --out "$OUT/distributed" --size "$SIZE" --steps 5 --warmup 2 \
        "${@:2}" >>"$OUT/bench_distributed.log" 2>&1
}
bench_rc=0
for NPROC in $NPROCS; do
    if [ "$BENCH" = all ]; then   # BERT and Llama, DDP and FSDP2, eager / pyfuser / Inductor
        bench 190 --wraps ddp,fsdp2 --models bert,llama --modes eager,pyfuser,inductor \
            --budget 150 || bench_rc=1
    else
        bench 60 --wraps ddp,fsdp2 --modes eager,pyfuser,pyfuser_jit --budget 40 || bench_rc=1
        bench 75 --wraps ddp --models bert,llama --modes inductor --budget 30 || bench_rc=1
    fi
done
tail -n 40 "$OUT/bench_distributed.log"
# the table of both runs (each saves its rows after every case, so a run cut short counts too)
$PY bench/distributed.py --report "$OUT/distributed" | tee "$OUT/distributed/distributed.md"
echo "bench: rc=$bench_rc, $(( $(date +%s) - start )) s"
[ $tests_rc = 0 ] && [ $bench_rc = 0 ]
