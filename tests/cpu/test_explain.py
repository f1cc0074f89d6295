"""pyfuser.explain and `pyfuser explain`: groups, segments, verdicts, cuts, kernels, fallbacks."""
from __future__ import annotations

import json

import pytest
import torch

import pyfuser
from pyfuser import DataType, FusionDefinition
from pyfuser.cli import main
from pyfuser.errors import PyfuserError
from pyfuser.explainer import explain
from pyfuser.explainer import frontends
from pyfuser.explainer.layout import layered
from pyfuser.schedule import registry

import segment_cases as C


def bias_relu_mm(x, b, w):
    y = torch.relu(x + b) * 2.0
    z = torch.mm(y, w)
    return torch.sigmoid(z) + 1.0


def _kernels(e):
    return [s for g in e.groups for s in g.segments if s.kind == "kernel"]


def test_groups_kernels_bytes_and_the_op_in_between():
    x, b, w = torch.randn(64, 32), torch.randn(32), torch.randn(32, 16)
    with torch.no_grad():
        e = explain(torch.jit.script(bias_relu_mm), x, b, w)
    assert e.frontend == "torchscript" and len(e.groups) == 2
    segs = _kernels(e)
    assert [s.scheduler for s in segs] == ["pointwise", "pointwise"]
    k0, k1 = segs[0].kernel, segs[1].kernel
    # a broadcast input counts once: x, b in; y out
    assert (k0.bytes_in, k0.bytes_out) == ((64 * 32 + 32) * 4, 64 * 32 * 4)
    assert (k1.bytes_in, k1.bytes_out) == (64 * 16 * 4, 64 * 16 * 4)
    for k in (k0, k1):
        assert k.params == dict(k.params) and k.params["vec"] >= 1 and "block" in k.params
        assert all(n >= 1 for n in k.launch["grid"] + k.launch["block"])
        assert "__global__" in k.cuda and k.name in k.cuda and "pf_ld" not in k.cuda.split(
            "__global__")[0][-20:]
    # every scheduler ranked above pointwise refused, with a reason
    v = segs[0].verdicts
    assert [x.scheduler for x in v] == registry.names()
    chosen = [x.scheduler for x in v if x.chosen]
    assert chosen == ["pointwise"]
    above = v[:registry.names().index("pointwise")]
    assert above and all(x.refusal for x in above)
    # the matmul between the groups is reported, with no lowering
    mm = [f for f in e.fallbacks if f.kind == "aten::mm"]
    assert len(mm) == 1 and mm[0].category == "no lowering" and mm[0].blocker is None
    text = e.text()
    assert "aten::mm" in text and "transpose refused:" in text and "pointwise" in text
    assert e.summary()["kernels"] == 2


def test_explain_matches_what_jit_runs():
    """The groups and kernels explain reports are the ones pyfuser.jit runs."""
    x, b, w = torch.randn(64, 32), torch.randn(32), torch.randn(32, 16)
    f = pyfuser.jit(torch.jit.script(bias_relu_mm))
    with torch.no_grad():
        f(x, b, w)
        e = explain(f, x, b, w)
    assert len(e.groups) == f.last_run.groups
    assert e.summary()["kernels"] == f.last_run.kernels


def test_run_check_refusal_names_the_inputs_reason():
    """softmax over dim 0 of a row-major tensor: inner_persistent's compile check passes, its
    run check refuses these inputs (the innermost axis is kept), the next scheduler plans it."""
    def softmax0(x):
        return torch.softmax(x, 0)
    with torch.no_grad():
        e = explain(torch.jit.script(softmax0), torch.randn(64, 48))
    (seg,) = _kernels(e)
    by = {v.scheduler: v for v in seg.verdicts}
    ip = by["inner_persistent"]
    assert ip.compile_ok and ip.run_ok is False and "innermost" in ip.run_reason
    assert seg.scheduler != "inner_persistent" and by[seg.scheduler].chosen
    assert "for these inputs:" in e.text()


def test_cuts_carry_the_segmenters_reason():
    f = C.two_reduction_domains()
    x = torch.randn(16, 24)
    e = explain(f, x)
    (g,) = e.groups
    assert e.frontend == "fusion_definition"
    assert g.split_reason and len([s for s in g.segments if s.kind != "host"]) >= 2
    assert g.cuts, "a tensor crosses between the two reductions"
    for c in g.cuts:
        assert c.reason.startswith("no scheduler takes them together") or "cycle" in c.reason
        assert c.from_segment < c.to_segment
        assert c.nbytes == 1 * 24 * 4 or c.nbytes == 16 * 24 * 4
    text = " ".join(e.text().split())          # unwrapped
    assert "cut " in text and "the same refusals as the whole group's" in text
    assert "reduction, inner_persistent, outer_persistent: reductions over different axes" in text
    # the segmenter's own record is in its dump too
    from pyfuser.segment.segmenter import segment
    sf = segment(f)
    assert sf.cuts and sf.split_reason and "cut " in str(sf)


def test_fusion_definition_whole_fusion_is_one_group():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True],
                              dtype=DataType.Float)
        fd.add_output(fd.ops.relu(fd.ops.mul(t0, t0)))
    x = torch.randn(8, 40)
    e = explain(fd, x)
    (g,) = e.groups
    (seg,) = g.segments
    assert seg.kernel.bytes_in == seg.kernel.bytes_out == 8 * 40 * 4
    assert e.fallbacks == [] and "every op" not in e.text()
    page = e.to_html()
    assert 'class="group" data-group="0"' in page and seg.kernel.name in page


def test_fallback_blockers():
    g = """graph(%x : Float(4, 8), %y : Float(4, 8)):
  %one : int = prim::Constant[value=1]()
  %a : Tensor = aten::mul(%x, %y)
  %r : Tensor = aten::add_(%x, %y, %one)
  %b : Tensor = aten::relu(%a)
  return (%b, %r)
"""
    e = explain(g, torch.randn(4, 8), torch.randn(4, 8))
    (add_,) = [f for f in e.fallbacks if f.kind == "aten::add_"]
    assert add_.category == "not fused" and "in-place op kept" in add_.reason
    assert add_.blocker is not None and add_.blocker.node == "graph input %x"
    assert "blocked by graph input %x" in e.text()


def relu2(x):
    return torch.relu(x) * 2.0


def test_grad_mode_marks_groups_eager_and_still_explains_them():
    x = torch.randn(16, 8, requires_grad=True)
    e = explain(torch.jit.script(relu2), x)
    (g,) = e.groups
    assert g.status == "eager" and "no backward" in g.eager_reason
    assert g.segments and g.segments[0].kernel is not None
    assert e.summary()["eager_groups"] == 1


def test_json_is_plain_data():
    x, b, w = torch.randn(64, 32), torch.randn(32), torch.randn(32, 16)
    with torch.no_grad():
        e = explain(torch.jit.script(bias_relu_mm), x, b, w)
    d = json.loads(json.dumps(e.as_dict()))
    assert d["summary"]["groups"] == 2 and "prelude" not in d
    seg = [s for s in d["groups"][0]["segments"] if s["kind"] == "kernel"][0]
    assert seg["kernel"]["params"]["vec"] >= 1 and seg["verdicts"][0]["scheduler"] == "transpose"


def test_a_new_frontend_registers_itself():
    """The hook a torch.compile backend uses: register_frontend(name, matches, collect)."""
    class FromFX:
        def __init__(self, fusion, args):
            self.fusion, self.args = fusion, args

    def collect(obj, inputs, options):
        src = frontends.GroupSource(0, "fx group", ["relu"], ["x"], ["y"], obj.fusion, obj.args)
        return frontends.Collected("fx graph", "fx", "cpu", "interpret", [src])

    frontends.register_frontend("test_fx", lambda o: isinstance(o, FromFX), collect, first=True)
    try:
        fs = C.mul_add()
        fusion = getattr(fs, "ir_fusion", fs)
        args = [torch.randn(24) for _ in fusion.inputs]
        e = explain(FromFX(fusion, args))
        assert e.frontend == "fx" and e.groups[0].segments[0].kernel is not None
        assert frontends.frontend_names()[0] == "test_fx"
    finally:
        frontends._FRONTENDS[:] = [f for f in frontends._FRONTENDS if f[0] != "test_fx"]


def test_unknown_object_is_a_one_line_error():
    with pytest.raises(PyfuserError, match="cannot explain a int"):
        explain(3)


def test_layout_keeps_order_and_bands():
    sizes = {k: (40, 20) for k in "abcdef"}
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"), ("f", "e")]
    pos, w, h = layered(sizes, edges)
    for s, t in edges:
        assert pos[t][1] > pos[s][1]
    boxes = sorted((y, x) for x, y in pos.values())
    for (y1, x1), (y2, x2) in zip(boxes, boxes[1:]):
        assert y1 != y2 or abs(x1 - x2) >= 40
    assert w >= max(x for x, _ in pos.values()) + 40 and h >= max(y for _, y in pos.values())
    bands = {"a": 0, "b": 0, "c": 1, "d": 1, "e": 2, "f": 2}
    pos, _, _ = layered(sizes, edges, bands)
    assert max(pos[k][1] for k in "ab") < min(pos[k][1] for k in "cd")
    assert max(pos[k][1] for k in "cd") < min(pos[k][1] for k in "ef")


def test_cli_explain_text_json_html(tmp_path, capsys):
    path = tmp_path / "g.ir"
    path.write_text("""graph(%x : Float(32, 64, strides=[64, 1], requires_grad=0, device=cpu),
      %w : Float(64, 16, strides=[16, 1], requires_grad=0, device=cpu)):
  %a : Tensor = aten::gelu(%x)
  %b : Tensor = aten::mm(%a, %w)
  %c : Tensor = aten::tanh(%b)
  return (%c)
""")
    assert main(["explain", str(path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"pyfuser explain: {path}") and "aten::mm" in out and "params:" in out
    assert main(["explain", str(path), "--device", "cpu", "--op", "mm"]) == 0
    only = capsys.readouterr().out
    assert "only what mentions 'mm': 0 group(s), 1 op(s)" in only and "aten::mm" in only
    assert "group 0" not in only
    assert main(["explain", str(path), "--device", "cpu", "--op", "tanh"]) == 0
    only = capsys.readouterr().out
    assert "1 group(s), 0 op(s)" in only and "aten::tanh" in only and "aten::gelu" not in only
    html_path = tmp_path / "r.html"
    assert main(["explain", str(path), "--device", "cpu", "--json", "--html", str(html_path)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["summary"]["groups"] == 2 and d["source"] == str(path)
    page = html_path.read_text()
    for i in range(2):
        assert f'class="group" data-group="{i}"' in page
    assert "aten::mm" in page
    for ref in ("http:", "https:", "src=", "<link", "@import"):
        assert ref not in page, ref


def test_cli_explain_errors_are_one_line(tmp_path, capsys):
    assert main(["explain", str(tmp_path / "missing.ir")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyfuser: error:") and len(err.strip().splitlines()) == 1


def test_pyfuser_explain_is_the_function_after_the_package_is_imported():
    """Regression: the package was named `pyfuser.explain`, so importing it replaced the lazy
    `pyfuser.explain` function with the module ('module' object is not callable)."""
    import pyfuser.explainer  # noqa: F401
    assert callable(pyfuser.explain) and pyfuser.explain is explain
