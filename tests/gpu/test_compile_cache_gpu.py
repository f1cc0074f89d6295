"""Compile time on CUDA: a new process with the cache directory of an earlier one loads the
torch.compile backend's plans (no lowering, segmentation, planning or NVRTC), launches the
kernels and matches eager; the plans' key holds the GPU (tests/cpu/test_compile_cache.py tests
the rest on the CPU)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cpu"))
import test_compile_cache as CC  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_new_process_on_cuda_reuses_the_plans_and_matches_eager(tmp_path):
    env = dict(os.environ, PYFUSER_CACHE_DIR=str(tmp_path / "shared"),
               PYTHONPATH=CC.ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cold = CC._process(env, "cuda")
    assert cold["equal"] and cold["nvrtc"] > 0 and cold["store_stores"] > 0
    assert cold["kernels"] > 0                     # the regions ran CUDA kernels
    warm = CC._process(env, "cuda")
    assert warm["equal"] and warm["kernels"] == cold["kernels"]
    assert (warm["lower"], warm["segment"], warm["plan"], warm["nvrtc"]) == (0, 0, 0, 0), warm
    assert warm["store_hits"] == cold["store_stores"] and warm["store_restored_plans"] > 0


def test_the_plans_key_names_the_gpu():
    from pyfuser.runtime import plan_store
    env = plan_store.environment("cuda", torch.device("cuda", 0))
    p = torch.cuda.get_device_properties(0)
    assert ("cuda", p.name, p.major, p.minor, p.multi_processor_count) == env[5][:5]
