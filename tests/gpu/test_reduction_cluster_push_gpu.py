"""A cluster row's combine by pushes counted on mbarriers (codegen/reduction_cluster_push.py, the
default) on the GPU, at full size: rows of 65536 over clusters, against eager (the reference
evaluator on the same CUDA inputs) and bit-equal to the cluster-barrier combine
($PYFUSER_RED_CLUSTER_PUSH=0), run after run; and with the grid capped so that each cluster
loops over many rows (the mbarriers' phases alternate on the hardware)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cpu"))
import reduction_cases as RC  # noqa: E402
from pyfuser.ir.evaluator import evaluate  # noqa: E402
from pyfuser.runtime import dispatch  # noqa: E402
from pyfuser.runtime.dispatch import execute_fusion  # noqa: E402
from pyfuser.segment.segmenter import segment  # noqa: E402

pytestmark = pytest.mark.gpu


def run(builder, shape, dt, push: str, monkeypatch, grid_blocks=None):
    """Outputs of a fresh fusion (planned under the knobs), checked against the evaluator,
    with the plan's `push`."""
    monkeypatch.setenv("PYFUSER_RED_CLUSTER_PUSH", push)
    if grid_blocks:
        monkeypatch.setenv("PYFUSER_RED_GRID_BLOCKS", str(grid_blocks))
    f = RC.fusion(builder, len(shape), dt, [1])
    gen = torch.Generator().manual_seed(11)
    xs = [x.cuda() for x in RC.inputs_for(f, shape, dt, [1], "contiguous", gen)]
    outs = execute_fusion(f, xs)
    rep = dispatch.last_report(f)
    assert rep.eager_segments == 0 and rep.kernels == 1, rep
    for i, (g, w) in enumerate(zip(outs, evaluate(f, xs))):
        RC.check_close(g, w, builder.__name__, shape[1], f"{builder.__name__} {shape} {dt} "
                       f"push={push} output {i}")
    plans = [e.plan for s in segment(f).segments if s.kind == "kernel"
             for e in dispatch.get_executor(s.fusion)._plans.values() if e.plan is not None]
    assert plans and all(p.params.cluster > 1 for p in plans), [p.params for p in plans]
    return f, xs, outs, all(p.params.push for p in plans)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("builder", [RC.softmax, RC.layer_norm, RC.rms_norm, RC.log_softmax],
                         ids=lambda b: b.__name__)
def test_pushed_combine_on_the_gpu(builder, dt, monkeypatch):
    f, xs, got, pushed = run(builder, (300, 65536), dt, "1", monkeypatch)
    assert pushed
    for _ in range(3):                              # the same bits, run after run
        assert all(torch.equal(a, b) for a, b in zip(got, execute_fusion(f, xs)))
    _, _, want, pushed = run(builder, (300, 65536), dt, "0", monkeypatch)
    assert not pushed
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("builder", [RC.layer_norm, RC.softmax], ids=lambda b: b.__name__)
def test_pushed_combine_over_many_rows_a_cluster(builder, monkeypatch):
    """264 blocks for 1000 rows: each cluster loops over about 30 rows, a phase of each mbarrier
    a row."""
    _, _, got, pushed = run(builder, (1000, 65536), torch.float32, "1", monkeypatch, 264)
    assert pushed
    _, _, want, _ = run(builder, (1000, 65536), torch.float32, "0", monkeypatch, 264)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
