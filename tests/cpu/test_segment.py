"""The segmenter on the CPU: seed 002's bookend views cost no kernel, cuts give a valid order.

Every fusion runs through dispatch with the reference evaluator and with the CPU interpreter of
the generated kernels (PYFUSER_CPU_EXECUTOR=interpret), and is checked against eager."""
import os
import sys

import pytest
import torch

from pyfuser.runtime import dispatch
from pyfuser.segment.segmenter import segment

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

C = load_module_from_path("segment_cases", os.path.join(
    os.path.dirname(__file__), "segment_cases.py"), fresh=True, register=False)

MODES = ["evaluator", "interpret"]


@pytest.fixture(autouse=True)
def _mode(request, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")
    yield


def _kinds(fs):
    return [(s.kind, s.scheduler) for s in fs.last_run.segments]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("two", [False, True])
def test_gelu_bookend_views_one_kernel(mode, two, monkeypatch):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    fs = C.gelu(two_outputs=two)
    x = torch.randn(64, 48)
    outs = fs.execute([x])
    torch.testing.assert_close(outs[-1], C.gelu_eager(x))
    assert fs.last_run.kernels == 1 and fs.last_run.host_segments == 2
    assert _kinds(fs) == [("host", None), ("kernel", "pointwise"), ("host", None)]
    if mode == "interpret":
        assert fs.last_run.launched == 1 and fs.last_run.segments[1].backend == "interpret"
    if two:   # T1 is a view of the input: same storage, no copy
        assert outs[0].data_ptr() == x.data_ptr() and outs[0]._base is x
        assert outs[0].shape == (4, 16, 48)
    # the kernel's program has no view in it: the views are host segments
    kernel = segment(fs.ir_fusion).segments[1]
    assert [e.op_name for e in kernel.exprs] == ["mul", "mul", "erf", "add", "mul"]
    assert outs[-1].is_contiguous() and outs[-1].shape == (64, 48)


@pytest.mark.parametrize("mode", MODES)
def test_gelu_without_views_is_one_kernel_on_the_user_fusion(mode, monkeypatch):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    fs = C.gelu(views=False)
    x = torch.randn(4, 16, 48)
    torch.testing.assert_close(fs.execute([x])[0], C.gelu_eager(x, views=False))
    sf = segment(fs.ir_fusion)
    assert len(sf.segments) == 1 and sf.segments[0].fusion is fs.ir_fusion
    assert _kinds(fs) == [("kernel", "pointwise")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("keep", C.ALL_KEEPS, ids=lambda k: "".join("ABC"[i] if k[i] else "-" for i in range(3)))
def test_sequential_views_one_kernel(mode, keep, monkeypatch):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    fs = C.sequential(keep)
    x = torch.randn(64, 48)
    (out,) = fs.execute([x])
    torch.testing.assert_close(out, C.sequential_eager(x, keep))
    assert fs.last_run.kernels == 1, str(segment(fs.ir_fusion))
    kernel = [s for s in segment(fs.ir_fusion).segments if s.kind == "kernel"][0]
    names = [e.op_name for e in kernel.exprs]
    assert names == ["add"] + (["view"] if keep[1] else []) + ["mul"]   # A and C are host views
    assert fs.last_run.host_segments == int(keep[0]) + int(keep[2])


@pytest.mark.parametrize("mode", MODES)
def test_transpose_with_bookend_views_one_transpose_kernel(mode, monkeypatch):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    fs = C.transpose()
    x = torch.randn(24, 8, 4)
    (out,) = fs.execute([x])
    assert torch.equal(out, C.transpose_eager(x)) and out.is_contiguous()
    assert _kinds(fs) == [("host", None), ("kernel", "transpose"), ("host", None)]
    kernel = segment(fs.ir_fusion).segments[1]
    assert [e.op_name for e in kernel.exprs] == ["set"]
    if mode == "interpret":
        assert fs.last_run.launched == 1 and fs.last_run.segments[1].backend == "interpret"
    assert kernel.fusion.inputs[0].stride_order is not None     # the kernel sees a permuted input


@pytest.mark.parametrize("mode", MODES)
def test_views_only_no_kernel_and_aliases(mode, monkeypatch):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    f = C.views_only()
    x = torch.randn(64, 48)
    outs = dispatch.execute_fusion(f, [x])
    ref = C.views_only_eager(x)
    for o, r in zip(outs, ref):
        assert torch.equal(o, r) and o.shape == r.shape and o.stride() == r.stride()
        assert o.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert outs[2] is x                                   # an output that is an input: same object
    report = dispatch.last_report(f)
    assert report.kernels == 0 and report.launched == 0 and report.host_segments == 1
    assert dispatch.run_summary(f)["kernels"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_normalization_is_one_kernel(mode, monkeypatch):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    f = C.reduction_then_pointwise()
    x = torch.randn(6, 10)
    outs = dispatch.execute_fusion(f, [x])
    for o, r in zip(outs, C.reduction_eager(x)):
        torch.testing.assert_close(o, r)
    sf = segment(f)
    assert [(s.kind, s.scheduler) for s in sf.segments] == \
        [("kernel", "inner_persistent"), ("host", None)], str(sf)


@pytest.mark.parametrize("mode", MODES)
def test_reduction_cut_into_valid_order(mode, monkeypatch):
    """Two reductions over different axes: two kernels, cut where the reduction domain changes,
    in a valid run order."""
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    f = C.two_reduction_domains()
    x = torch.randn(6, 10)
    outs = dispatch.execute_fusion(f, [x])
    for o, r in zip(outs, C.two_domains_eager(x)):
        torch.testing.assert_close(o, r)
    sf = segment(f)
    assert [s.kind for s in sf.segments] == ["kernel", "kernel"], str(sf)
    produced = {id(v) for v in f.inputs}
    for s in sf.segments:                                 # valid run order
        assert all(id(v) in produced for v in s.inputs), str(sf)
        produced.update(id(v) for v in s.outputs)
    assert dispatch.last_report(f).eager_segments == 0


def test_unschedulable_reduction_is_an_eager_segment():
    f = C.complex_reduction()
    sf = segment(f)
    assert [s.kind for s in sf.segments] == ["eager"] and "complex" in sf.segments[0].reason
    x = torch.randn(3, 4, dtype=torch.complex64)
    torch.testing.assert_close(dispatch.execute_fusion(f, [x])[0], x.sum(1))


def test_segmentation_is_cached_and_dumps(monkeypatch, capsys):
    monkeypatch.setenv("PYFUSER_DUMP", "segmenter_logging,segmented_fusion")
    fs = C.transpose()
    x = torch.randn(24, 8, 4)
    fs.execute([x], ) if False else dispatch.execute_fusion(fs.ir_fusion, [x], mode="evaluator")
    err = capsys.readouterr().err
    assert "[segmenter_logging] transpose scheduler" in err and "accepted" in err
    assert "[segmented_fusion]" in err and "kernel [transpose]" in err and "host" in err
    sf = segment(fs.ir_fusion)
    dispatch.execute_fusion(fs.ir_fusion, [torch.randn(48, 8, 4).view(48, 8, 4)[:24]], mode="evaluator")
    assert segment(fs.ir_fusion) is sf and "segmenter_logging" not in capsys.readouterr().err
    dispatch.clear_caches()
    assert segment(fs.ir_fusion) is not sf


def test_refusing_scheduler_logs_reason_once(monkeypatch, capsys):
    monkeypatch.setenv("PYFUSER_DUMP", "segmenter_logging")
    f = C.reduction_then_pointwise()
    segment(f)
    err = capsys.readouterr().err
    assert "reduction scheduler =====\nrefused" in err and "normalization" in err
    assert "inner_persistent scheduler =====\naccepted" in err
    assert "pointwise scheduler" not in err             # the first acceptance ends the search


def test_bad_input_is_execute_error():
    from pyfuser.errors import ExecuteError
    fs = C.gelu()
    with pytest.raises(ExecuteError):
        fs.execute([torch.randn(64, 48, dtype=torch.float64)])


def test_view_between_ops_is_one_vectorized_kernel():
    """gelu_mid_view (bench/views.py's row): one kernel segment, no host segment, and the view's
    load is affine (vectorized) in the interpreter's plan."""
    from pyfuser.codegen import api
    fs = C.gelu_mid_view()
    sf = segment(fs.ir_fusion)
    assert [s.kind for s in sf.segments] == ["kernel"]
    x = torch.randn(C.SMALL_GELU[0], C.SMALL_GELU[1])
    plan = api.plan_kernel(sf.segments[0].fusion, [x])
    assert plan.schedule.params.vec == 4 and any(a.linear for a in plan.schedule.accesses)
    (out,) = fs.execute([x])
    torch.testing.assert_close(out, C.gelu_mid_view_eager(x))


@pytest.mark.parametrize("mode", MODES)
def test_view_between_two_kernels_runs_on_the_host(mode, monkeypatch):
    """A normalization's output reshaped and summed over its rows (a bias gradient): the view
    no kernel takes with either side runs as a torch view between the two kernels (a host
    segment), not as an eager segment, so the call stays replayable."""
    from pyfuser.ir import builder as B
    from pyfuser.ir.dtypes import DataType
    from pyfuser.ir.fusion import Fusion
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1, -1], DataType.Float)
        t = B.elementwise("mul", x, 2.0)
        u = B.elementwise("sub", t, B.reduction("sum", t, [2], keepdim=True))
        f.add_output(u)
        f.add_output(B.reduction("sum", B.reshape(u, [-1, u.logical[2].extent]), [0]))
    assert [(s.kind, s.scheduler) for s in segment(f).segments] == \
        [("kernel", "inner_persistent"), ("host", None), ("kernel", "reduction")]
    x = torch.randn(4, 6, 8)
    u, s = dispatch.execute_fusion(f, [x])
    want = x * 2 - (x * 2).sum(2, keepdim=True)
    torch.testing.assert_close(u, want)
    torch.testing.assert_close(s, want.reshape(-1, 8).sum(0))
    assert dispatch.last_report(f).eager_segments == 0


@pytest.mark.parametrize("mode", MODES)
def test_view_after_a_cat_leaves_the_cat_kernel_for_the_host(mode, monkeypatch):
    """GPT-2's q/k/v gradients: cat -> view -> the bias gradient's row sum, the view also an
    output. The view joined the cat's kernel, whose loads then went through div / mod index
    arithmetic one bf16 element a thread; it is peeled off to the host, the cat keeps vectors
    of 8 and the values are eager's."""
    from pyfuser.codegen import api
    from pyfuser.ir import builder as B
    from pyfuser.ir.dtypes import DataType
    from pyfuser.ir.fusion import Fusion
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    f = Fusion()
    with f:
        xs = [B.define_tensor([-1, -1, -1], DataType.BFloat16) for _ in range(3)]
        v = B.reshape(B.cat(xs, 2), [-1, 48])
        f.add_output(v)
        f.add_output(B.cast(B.reduction("sum", B.cast(v, DataType.Float), [0]), DataType.BFloat16))
    sf = segment(f)
    assert [(s.kind, s.scheduler) for s in sf.segments] == \
        [("kernel", "pointwise"), ("host", None), ("kernel", "reduction")]
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")      # plan here, not from disk
    plans = []
    real = api.plan_kernel
    monkeypatch.setattr(api, "plan_kernel", lambda g, i: plans.append(real(g, i)) or plans[-1])
    args = [torch.randn(2, 8, 16, dtype=torch.bfloat16) for _ in range(3)]
    v, s = dispatch.execute_fusion(f, args)
    if mode == "interpret":
        assert [p.params.vec for p in plans if p.scheduler == "pointwise"] == [8]
    want = torch.cat(args, 2).view(-1, 48)
    assert torch.equal(v, want) and v.stride() == want.stride()
    torch.testing.assert_close(s, want.float().sum(0).to(torch.bfloat16))


@pytest.mark.parametrize("mode", MODES)
def test_view_of_a_permuted_value_stays_in_its_kernel(mode, monkeypatch):
    """The view after a pointwise op of a permuted input is not peeled off to the host: the
    kernel would write the op's value permuted (eager's layout) and the host's reshape would
    copy it; in the kernel the view costs nothing. Values and strides are eager's."""
    from pyfuser.ir import builder as B
    from pyfuser.ir.dtypes import DataType
    from pyfuser.ir.fusion import Fusion
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1, -1], DataType.Float)
        v = B.reshape(B.elementwise("mul", B.permute(x, [0, 2, 1]), 2.0), [-1, 8])
        f.add_output(v)
        f.add_output(B.reduction("sum", v, [0]))
    segs = segment(f).segments
    assert [(s.kind, s.scheduler) for s in segs] == \
        [("host", None), ("kernel", "pointwise"), ("kernel", "reduction")]
    assert [e.op_name for e in segs[1].exprs] == ["mul", "view"]
    x = torch.randn(2, 8, 16)
    v, s = dispatch.execute_fusion(f, [x])
    want = (x.permute(0, 2, 1) * 2).reshape(-1, 8)
    assert torch.equal(v, want) and v.stride() == want.stride()
    torch.testing.assert_close(s, want.sum(0))


def test_extract_with_the_fusions_index_is_the_same_sub_fusion():
    """The segmenter extracts its groups with one FusionIndex per Fusion (the memo's base and
    the values' order built once): every group extracted with it prints the same sub-Fusion,
    with the same original values feeding its inputs and the same outputs, as one extracted
    without; an index of another Fusion is not used."""
    from pyfuser.segment.extract import FusionIndex, extract
    from pyfuser.segment.groups import Groups
    f = C.reduction_then_pointwise()
    exprs = f.used_exprs()
    groups = Groups(f, exprs, exprs)
    other = FusionIndex(C.two_reduction_domains())
    cuts = [exprs, exprs[:1], exprs[1:], exprs[len(exprs) // 2:], exprs[1:-1]]
    for part in [p for p in cuts if p]:
        ins, outs = groups.boundary(part)
        plain = extract(f, part, ins, outs)
        for index in (groups.index, other):
            got = extract(f, part, ins, outs, index=index)
            assert str(got.fusion) == str(plain.fusion)
            assert got.inputs == plain.inputs and got.outputs == plain.outputs
            assert [v.name for v in got.fusion.vals] == [v.name for v in plain.fusion.vals]
    assert len(groups.index.val_at) == len(f.vals)


def test_a_single_expr_is_offered_alone_only_when_the_merging_needs_it(monkeypatch):
    """The cut of two reductions over different axes: an expr whose neighbour is already a
    kernel joins it through the union's offer, so fewer single exprs are offered alone than
    there are exprs, and the segmentation is the one every verdict made up front gave (two
    reduction kernels, the column sum apart)."""
    from pyfuser.segment import segmenter as S
    f = C.two_reduction_domains()
    compute = f.used_exprs()
    offered = []
    real = S._offer

    def counting(fusion, groups, exprs, orders, copies=frozenset()):
        offered.append(len(exprs))
        return real(fusion, groups, exprs, orders, copies)
    monkeypatch.setattr(S, "_offer", counting)
    sf = S._segment(f)
    assert [(s.kind, s.scheduler) for s in sf.segments if s.kind == "kernel"] == \
        [("kernel", "reduction"), ("kernel", "reduction")], str(sf)
    singles = offered.count(1)
    assert 0 < singles < len(compute), (offered, len(compute))
