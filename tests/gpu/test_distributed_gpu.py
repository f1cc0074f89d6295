"""pyfuser under torch.distributed on GPUs (the CPU versions: tests/cpu/test_distributed.py and
test_cache_sharing.py).

- One GPU: 4 processes fuse the same programs on cuda:0 into one fresh cache (each kernel
  compiled by NVRTC in one process, loaded by the others; results equal eager's), and 2 DDP
  ranks with gloo sharing cuda:0 train through pyfuser and equal one process (FSDP2 needs
  collectives gloo may lack on CUDA tensors: it runs with NCCL only).
- Two GPUs or more: 2 ranks with NCCL, one GPU each, DDP and FSDP2.
The torch.compile(backend="pyfuser") scenarios run only where that backend is importable.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cpu"))
import cache_workers as W  # noqa: E402
import distributed_workers as DW  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.multiprocess]
SCENARIOS = [k for k in DW.SCENARIOS if not k.startswith("compile_") or
             DW.compile_unavailable() is None]
DDP_SCENARIOS = [k for k in SCENARIOS if k.endswith("_ddp")]
# fused GPU kernels against eager's (training groups run eagerly; the input normalisation and
# the evaluation forward are fused): float32 tolerance of a few ulps through a short network
RTOL, ATOL = 1e-4, 1e-5


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_processes_on_one_gpu_compile_each_kernel_once(tmp_path):
    n = 4
    spawn = mp.get_context("spawn")
    barrier, queue = spawn.Barrier(n), spawn.Queue()
    cache = str(tmp_path / "cache")
    procs = [spawn.Process(target=W.run_fusions, args=(cache, barrier, queue, i, "cuda"))
             for i in range(n)]
    for p in procs:
        p.start()
    reports = [queue.get(timeout=300)[1] for _ in procs]
    for p in procs:
        p.join(60)
    assert all("error" not in r for r in reports), [r.get("error") for r in reports]
    kernels = reports[0]["kernels"]
    assert kernels >= 3 and all(r["errors"] == [] for r in reports), reports
    assert all(r["nvrtc"] + r["disk"] == kernels for r in reports)
    assert sum(r["nvrtc"] for r in reports) == kernels, [r["nvrtc"] for r in reports]


@pytest.fixture(scope="module")
def gloo_one_gpu(tmp_path_factory):
    return DW.run_ranks(tmp_path_factory.mktemp("gloo"), DDP_SCENARIOS, 2, "gloo", "cuda")


@pytest.fixture(scope="module")
def nccl_two_gpus(tmp_path_factory):
    if _gpus() < 2:
        pytest.skip(f"NCCL across GPUs needs 2 GPUs ({_gpus()} here)")
    if not torch.distributed.is_nccl_available():
        pytest.skip("NCCL is not available in this torch")
    return DW.run_ranks(tmp_path_factory.mktemp("nccl"), SCENARIOS, 2, "nccl", "cuda")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "single"))


def _check(ranks, kind):
    single = DW.train(kind, device="cuda")
    DW.check_ranks(ranks[kind], single, DW.train_eager("cuda"), RTOL, ATOL)


@pytest.mark.parametrize("kind", DDP_SCENARIOS)
def test_gloo_ranks_sharing_one_gpu(gloo_one_gpu, kind):
    _check(gloo_one_gpu, kind)


@pytest.mark.parametrize("kind", SCENARIOS)
def test_nccl_ranks_on_two_gpus(nccl_two_gpus, kind):
    _check(nccl_two_gpus, kind)
