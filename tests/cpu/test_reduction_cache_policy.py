"""Cache policies and shared-memory layout of the reduction family's kernels (speed only: the
results are checked against eager by `run`, through the CPU interpreter of the same kernel IR).

In a kernel writing no full-size output (a pure reduction), a load that moves along every axis
(each element read once) asks L2 to evict it first, and in a streamed kernel a pass that reads
a tensor a later pass reads again asks L2 to keep it (evict_last); loads broadcast along an axis
and the loads of a normalization writing full-size rows stay plain.
$PYFUSER_LOAD_CACHE overrides. The outer kernels' shared-memory tree puts lane v of thread tx
at v * bdimx + tx (no bank conflict)."""
import re

import pytest
import torch

import reduction_cases as RC
from pyfuser.codegen import kernel_ir as K
from codegen_cases import compile_many
from test_reduction_kernels import run as _run

PLANS: list = []


def run(*args):
    plan = _run(*args)
    PLANS.append(plan)
    return plan


def _policies(plan) -> dict:
    """{tensor parameter: [cache policy of each of its loads, in kernel order]}."""
    out: dict = {}
    for ld in plan.kernel_ir.walk():
        if isinstance(ld, K.Load):
            out.setdefault(ld.ptr, []).append(ld.cache)
    return out


def _inputs(plan) -> list:
    """The kernel's tensor parameter names of the fusion's inputs, in order."""
    n = len(plan.fusion.tensor_inputs())
    return [t.name for t in sorted(plan.kernel_ir.tensors.values(), key=lambda t: t.seg)][:n]


def test_a_row_reduction_reads_evict_first():
    for builder in (RC.reduce_op("sum"), RC.var_mean, RC.logsumexp):
        plan = run(builder, (37, 300), [1], torch.float32, "contiguous")
        (x,) = _inputs(plan)
        assert set(_policies(plan)[x]) == {"ef"}, builder.__name__
        assert "pf_ldc<PF_EF" in plan.kernel.source


def test_a_per_row_input_and_a_normalization_stay_plain():
    plan = run(RC.row_scaled_sum, (37, 300), [1], torch.float32, "contiguous")
    x, s = _inputs(plan)
    pol = _policies(plan)
    assert set(pol[x]) == {"ef"} and set(pol[s]) == {""}
    plan = run(RC.layer_norm, (37, 300), [1], torch.float32, "contiguous")
    assert all(set(p) == {""} for p in _policies(plan).values() if p), _policies(plan)


def test_column_sums_read_once_are_evict_first():
    plan = run(RC.reduce_op("sum"), (300, 37), [0], torch.float32, "contiguous")
    assert plan.params.kind == "outer"
    (x,) = _inputs(plan)
    assert set(_policies(plan)[x]) == {"ef"}


def test_a_streamed_pass_keeps_what_a_later_pass_reads(monkeypatch):
    monkeypatch.setenv("PYFUSER_RED_ONLINE", "0")     # logsumexp as max, then sum of exp
    monkeypatch.setenv("PYFUSER_RED_STEPS", "0")      # streamed
    plan = run(RC.logsumexp, (37, 300), [1], torch.float32, "contiguous")
    assert not plan.params.persistent and plan.params.passes == 2
    (x,) = _inputs(plan)
    pol = _policies(plan)[x]
    assert len(pol) >= 2 and pol[-1] == "ef" and set(pol[:-1]) == {"el"}, pol


def test_the_environment_overrides_the_policy(monkeypatch):
    monkeypatch.setenv("PYFUSER_LOAD_CACHE", "plain")
    plan = run(RC.reduce_op("sum"), (37, 300), [1], torch.float32, "contiguous")
    (x,) = _inputs(plan)
    assert set(_policies(plan)[x]) == {""}
    assert "PF_EF" not in plan.kernel.source.split('extern "C"')[1]


def test_the_outer_tree_is_free_of_bank_conflicts(monkeypatch):
    """Lane v of thread tx at v * bdimx + tx: consecutive threads, consecutive words."""
    monkeypatch.setenv("PYFUSER_RED_BDIMY", "8")
    plan = run(RC.reduce_op("sum"), (300, 64), [0], torch.float32, "contiguous")
    p = plan.params
    assert p.kind == "outer" and p.bdimy == 8 and p.vec > 1
    body = "\n".join(line for line in plan.kernel.source.split('extern "C"')[1].splitlines()
                     if "__shared__" not in line)
    idx = re.findall(r"red\d+\[[^\]]*\]\[([^\]]*)\]", body)
    assert idx and all(i == f"((v * {p.bdimx}) + ((nidx_t)threadIdx.x))" for i in idx), set(idx)


def test_kernels_compile_for_sm90():
    """The kernels above (evict_first / evict_last loads, the outer tree), one NVRTC module."""
    pytest.importorskip("cuda.bindings.nvrtc")
    if not PLANS:
        run(RC.layer_norm, (37, 300), [1], torch.float32, "contiguous")
    compile_many(PLANS)


def test_hints_compile_away_before_sm80(monkeypatch):
    """createpolicy / .L2::cache_hint need sm_80: for an older arch the prelude makes those
    accesses plain, so a kernel with evict_first loads and stores still compiles."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from codegen_cases import PRELUDE
    from pyfuser.runtime.nvrtc import compile_cuda
    monkeypatch.setenv("PYFUSER_STORE_CACHE", "ef")
    plan = run(RC.reduce_op("sum"), (37, 300), [1], torch.float32, "contiguous")
    assert "pf_ldc<PF_EF" in plan.kernel.source
    src = PRELUDE + f"\ntypedef {plan.index_type} nidx_t;\n" + plan.body
    for arch in ("sm_75", "sm_80"):
        compile_cuda(src, plan.kernel.name, arch)
