"""The tail scheduler (schedule/tail.py, codegen/tail_lowering.py): a row reduction and the
reduction of its rows to scalars (a loss's mean) as one kernel whose last block reduces the
rows, through torch.compile(backend=pyfuser) on the CPU interpreter (NVRTC-compiled for sm_90
first, the global-memory race check on): eager's values, the same bits every run, one kernel;
the run-time refusals (too many rows for one block, no rows) as the kernels of before; the
compile-time refusals with their reasons."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.runtime import dispatch
from pyfuser.schedule import tail

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile", "tail_on")


def _run(f, *args):
    with torch.no_grad():
        out = pyfuser.compile(f)(*args)
        want = f(*args)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert_ran_as_sm90_kernels(regions)
    reports = [dispatch.last_report(r.fusion) for r in regions]
    _run.launched = sum(r.kernels() for r in regions)
    return out, want, [s for rep in reports for s in rep.segments if s.kind == "kernel"]


def _schedulers(segments):
    return [s.scheduler for s in segments]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("rows,classes", [(1, 5), (7, 9), (37, 130), (300, 33)])
def test_cross_entropy_and_its_mean_are_one_kernel(rows, classes, reduction):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, classes, generator=gen) * 3
    t = torch.randint(0, classes, (rows,), generator=gen)
    t[::4] = -100                                       # ignored rows: the mean's count
    f = lambda a, b: F.cross_entropy(a * 1.5, b, reduction=reduction)   # noqa: E731
    out, want, segs = _run(f, x, t)
    assert _schedulers(segs) == ["tail"], segs
    assert out.shape == want.shape and out.dtype == want.dtype
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    again, _, _ = _run(f, x, t)
    assert torch.equal(again, out) or (out.isnan().all() and again.isnan().all())


def test_the_tail_sums_in_the_same_order_every_run():
    """The last block reduces the rows' values in its plan's fixed order (no float atomics):
    a sum whose rounding depends on the order gives the same bits in every run."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(999, 17, generator=gen) * torch.logspace(-6, 6, 17)
    f = lambda a: torch.logsumexp(a, -1).sum()   # noqa: E731
    outs = [_run(f, x) for _ in range(3)]
    assert all(_schedulers(segs) == ["tail"] for _, _, segs in outs)
    assert outs[0][0].item() == outs[1][0].item() == outs[2][0].item()
    torch.testing.assert_close(outs[0][0], outs[0][1], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("f", [
    lambda x: x.var(-1).mean(),
    lambda x: (x.amax(-1) - x.amin(-1)).sum() * 0.5,
    lambda x: torch.stack([x.sum(-1).amax(), x.sum(-1).mean()]),
    lambda x: F.log_softmax(x, -1)[:, 0].mean(),
    lambda x: (x.softmax(-1) * x).sum(-1).sum(),
], ids=["var_mean", "range_sum", "two_tails", "log_softmax_pick", "softmax_dot"])
def test_row_statistics_reduced_to_scalars(f):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(65, 47, generator=gen)
    out, want, segs = _run(f, x)
    assert "tail" in _schedulers(segs), segs
    assert out.shape == want.shape and out.dtype == want.dtype
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_rows_too_many_for_one_block_are_two_kernels(monkeypatch):
    """The tail reads at most MAX_TAIL_ELEMENTS a tensor (one block): past it the run check
    refuses and the segment runs as the other schedulers' kernels, with eager's values."""
    monkeypatch.setattr(tail, "MAX_TAIL_ELEMENTS", 16)
    x = torch.randn(40, 9, generator=torch.Generator().manual_seed(6))
    t = torch.randint(0, 9, (40,), generator=torch.Generator().manual_seed(7))
    out, want, segs = _run(lambda a, b: F.cross_entropy(a, b), x, t)
    assert _run.launched == 2, segs         # the tail's segment, run as two kernels
    torch.testing.assert_close(out, want)


def test_no_rows_runs_as_eager_does():
    """No rows: an empty head launches no block, so no block would run the tail; refused at
    run time, the mean of nothing is eager's NaN."""
    f = lambda a: torch.logsumexp(a * 2, -1).mean()    # noqa: E731
    out, want, segs = _run(f, torch.randn(0, 6))
    assert out.isnan() and want.isnan()


def _sum(x, axes):
    return B.reduction("sum", x, axes)


def _fusion(build):
    with Fusion() as fusion:
        x = B.define_tensor([-1, -1], DataType.Float)
        fusion.add_input(x)
        for o in build(x):
            fusion.add_output(o)
    return fusion


@pytest.mark.parametrize("build,why", [
    (lambda x: [_sum(x, [0, 1])], "not a row reduction followed"),
    (lambda x: [_sum(_sum(x, [1]), [0]), _sum(x, [0, 1])], "reduces axes other than the rows"),
    (lambda x: [_sum(x, [1]), _sum(x, [0])], "not a row reduction followed"),
], ids=["one_domain", "full_of_the_input", "two_row_domains"])
def test_fusions_it_refuses_say_why(build, why):
    ok, reason = tail.can_schedule(_fusion(build))
    assert not ok and why in reason, reason


def test_a_row_sum_and_its_total_split_into_head_and_tail():
    fusion = _fusion(lambda x: [_sum(B.elementwise("exp", _sum(x, [1])), [0])])
    sp, why = tail.split(fusion)
    assert sp is not None, why
    assert [e.op_name for e in sp.head_exprs] == ["sum", "exp"]
    assert [e.op_name for e in sp.tail_exprs] == ["sum"]
    assert [v.name for v in sp.crossing] == [sp.head_exprs[-1].outputs[0].name]
    assert sp.head_scheduler == "reduction"


def test_a_head_of_fewer_threads_than_the_tail_needs_is_two_kernels(monkeypatch):
    """A row kernel's block of fewer threads than MIN_THREADS (the tail's warp reductions need
    a warp: a ViT's loss at batch 2 on the GPU had blocks of 2 threads) is refused at run time,
    not at plan time: the two kernels of before."""
    monkeypatch.setattr(tail, "MIN_THREADS", 4096)
    x = torch.randn(2, 10, generator=torch.Generator().manual_seed(8))
    t = torch.tensor([3, 7])
    out, want, segs = _run(lambda a, b: F.cross_entropy(a, b), x, t)
    assert _run.launched == 2, segs
    torch.testing.assert_close(out, want)


def test_off_by_default_the_mean_is_a_second_kernel(monkeypatch):
    from pyfuser.frontend.fx.compile_graph import clear_cache
    monkeypatch.delenv("PYFUSER_TAIL")
    clear_cache()
    x = torch.randn(43, 11, generator=torch.Generator().manual_seed(10))
    t = torch.randint(0, 11, (43,), generator=torch.Generator().manual_seed(11))
    out, want, segs = _run(lambda a, b: F.cross_entropy(a, b), x, t)
    assert _schedulers(segs) == ["reduction", "reduction"], segs
    torch.testing.assert_close(out, want)
    assert tail.can_schedule(_fusion(lambda x: [_sum(_sum(x, [1]), [0])]))[1].startswith("off")


_ROW = ["{x}.sum(-1)", "{x}.amax(-1)", "{x}.amin(-1)", "{x}.mean(-1)", "torch.logsumexp({x}, -1)",
        "{x}.var(-1)", "(torch.softmax({x}, -1) * {x}).sum(-1)", "F.log_softmax({x}, -1)[..., 0]",
        "{x}.square().sum(-1).sqrt()"]
_POST = ["{r}", "{r} * 2 + 1", "torch.exp(-{r}.abs())", "torch.where({r} > 0, {r}, -{r} * 0.5)"]
_FULL = ["{p}.sum()", "{p}.mean()", "{p}.amax()", "{p}.amin()"]


def _random_tail_program(r):
    lines, outs = [], []
    for k in range(r.randint(1, 3)):
        lines += [f"r{k} = " + r.choice(_ROW).format(x="x" if r.random() < 0.7 else "(x * y)"),
                  f"p{k} = " + r.choice(_POST).format(r=f"r{k}")]
        outs.append(r.choice(_FULL).format(p=f"p{k}"))
    if r.random() < 0.3:
        lines.append("t = (p0 > 0).float()")
        outs.append("(p0 * t).sum() / t.sum().clamp_min(1)")
    ret = " + ".join(outs) if r.random() < 0.5 else "torch.stack([" + ", ".join(outs) + "])"
    return "def f(x, y):\n    " + "\n    ".join(lines) + f"\n    return {ret}\n"


@pytest.mark.parametrize("seed", range(6))
def test_random_row_statistics_tails_are_eagers(seed):
    """Random row reductions, pointwise ops of them and reductions of the rows to scalars (a
    scratch campaign ran 340 such programs in the twenty-eighth session, all eager's values):
    one tail kernel, eager's values within float rounding."""
    import random
    r = random.Random(seed)
    ns = {"torch": torch, "F": F}
    exec(_random_tail_program(r), ns)               # noqa: S102 - the test's own program
    rows, cols = r.choice([2, 7, 64, 257]), r.choice([3, 17, 100])
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(rows, cols, generator=gen) * 2, torch.randn(rows, cols, generator=gen)
    out, want, segs = _run(ns["f"], x, y)
    assert "tail" in _schedulers(segs), segs
    torch.testing.assert_close(out, want, rtol=2e-4, atol=2e-4)
