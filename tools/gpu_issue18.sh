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
set -x
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT/distributed"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)"
export PYFUSER_PROGRESS=plain
PY="${PYTHON:-python3}"
NPROC="${NPROC:-1}"
SIZE="${SIZE:-8,256,512,2}"
nvidia-smi --query-gpu=name,memory.total --format=csv
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.device_count(), 'GPU(s)')"

start=$(date +%s)
timeout 100 $PY -m pytest tests/gpu/test_distributed_gpu.py -rfEs -p no:cacheprovider \
    >"$OUT/gpu_distributed_tests.log" 2>&1
tests_rc=$?
tail -n 30 "$OUT/gpu_distributed_tests.log"
echo "tests: rc=$tests_rc, $(( $(date +%s) - start )) s"

start=$(date +%s)
bench() {   # one bench/distributed.py run; its rows join the table in $OUT/distributed
    timeout "$1" $PY -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
        bench/distributed.py --out "$OUT/distributed" --size "$SIZE" --steps 5 --warmup 2 \
        "${@:2}" >>"$OUT/bench_distributed.log" 2>&1
}
bench 60 --wraps ddp,fsdp2 --modes eager,pyfuser,pyfuser_jit --budget 40
bench_rc=$?
bench 75 --wraps ddp --models bert,llama --modes inductor --budget 30 || bench_rc=1
tail -n 40 "$OUT/bench_distributed.log"
# the table of both runs (each saves its rows after every case, so a run cut short counts too)
$PY bench/distributed.py --report "$OUT/distributed" | tee "$OUT/distributed/distributed.md"
echo "bench: rc=$bench_rc, $(( $(date +%s) - start )) s"
[ $tests_rc = 0 ] && [ $bench_rc = 0 ]
