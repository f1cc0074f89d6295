"""Golden tests of the Fusion IR printer (nvFuser's text format) and of the verifier.

Golden files live in tests/cpu/golden/. Set PYFUSER_UPDATE_GOLDEN=1 to rewrite them after an
intended format change (then review the diff). `seed003_nvfuser.txt` is nvFuser's own printout of
the seed-003 fusion (leading whitespace lost in the seed); our seed-003 fusion must print the same
text once value numbers are renumbered by first appearance and indentation is ignored.
"""
import os
import re
from pathlib import Path

import pytest
import torch

from pyfuser.ir import DataType, Fusion, ParallelType
from pyfuser.ir import builder as B
from pyfuser.ir.evaluator import evaluate
from pyfuser.ir.verifier import IRVerifyError, verify

GOLDEN = Path(__file__).parent / "golden"
F32 = DataType.Float


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("PYFUSER_UPDATE_GOLDEN"):
        path.write_text(text + "\n")
    assert path.exists(), f"missing golden file {path}; run with PYFUSER_UPDATE_GOLDEN=1"
    assert text + "\n" == path.read_text(), f"printed IR differs from {path}"


def build_seed003():
    """Inference batch-norm(x1) * alpha + batch-norm(x0), relu: the fusion seed 003 prints."""
    f = Fusion()
    with f:
        x0 = B.define_tensor([-1] * 4, F32)
        w0, b0, m0, v0 = (B.define_tensor([-1], F32) for _ in range(4))
        x1 = B.define_tensor([-1] * 4, F32)
        w1, b1, m1, v1 = (B.define_tensor([-1], F32) for _ in range(4))
        alpha = B.symbolic_scalar(DataType.Int)
        f.add_input(alpha)

        def bcast(t):
            return B.broadcast(t, [True, False, True, True])

        def batch_norm(x, w, b, m, v):
            centered = B.elementwise("sub", x, bcast(m))
            inv_std = B.elementwise("rsqrt", B.elementwise("add", v, 9.9999997473787516e-06))
            y = B.elementwise("mul", centered, bcast(inv_std))
            y = B.elementwise("mul", y, bcast(w))
            return B.elementwise("add", y, bcast(b))

        y1 = batch_norm(x1, w1, b1, m1, v1)
        y0 = batch_norm(x0, w0, b0, m0, v0)
        scaled = B.elementwise("mul", y1, B.cast(alpha, DataType.Double))
        f.add_output(B.elementwise("relu", B.elementwise("add", y0, scaled)))
    return f


def canonical(text: str) -> list[str]:
    """Renumber values by first appearance per kind; strip indentation and blank lines."""
    seen: dict = {}

    def renumber(m):
        key = (m.group(1), m.group(2))
        seen.setdefault(key, sum(1 for k in seen if k[0] == m.group(1)))
        return f"{m.group(1)}{seen[key]}"
    text = re.sub(r"\b(T|iS|bS|rS|i|d|b)(\d+)(?!\d)", renumber, text)
    return [line.strip() for line in text.splitlines() if line.strip()]


def op_kinds(text: str) -> list[str]:
    kernel = text.split("TransformPrinter")[0]
    pattern = r"= (broadcast)\(|^\s*([-+*/]) \S|= \((\w+)\)\(|= (\w+)\("
    return [next(g for g in m.groups() if g) for m in re.finditer(pattern, kernel, re.M)]


def test_seed003_golden():
    f = build_seed003()
    verify(f)
    check_golden("seed003_builder", str(f))


def test_seed003_matches_nvfuser_printout():
    ours = str(build_seed003())
    theirs = (GOLDEN / "seed003_nvfuser.txt").read_text()
    assert op_kinds(ours) == op_kinds(theirs)
    assert op_kinds(ours)[:4] == ["broadcast", "-", "+", "rsqrtf"]
    assert canonical(ours) == canonical(theirs)


def test_seed003_evaluates_like_eager():
    f = build_seed003()
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 4, 5, generator=g)
    p0 = [torch.rand(3, generator=g) + 0.5 for _ in range(4)]
    p1 = [torch.rand(3, generator=g) + 0.5 for _ in range(4)]
    (out,) = evaluate(f, [x0, *p0, x1, *p1, 3])
    bn = torch.nn.functional.batch_norm
    ref0 = bn(x0, p0[2], p0[3], p0[0], p0[1], False, 0.1, 9.9999997473787516e-06)
    ref1 = bn(x1, p1[2], p1[3], p1[0], p1[1], False, 0.1, 9.9999997473787516e-06)
    torch.testing.assert_close(out, torch.relu(ref0 + 3 * ref1))


def test_constants_print_17_digits():
    f = Fusion()
    with f:
        t = B.define_tensor([-1], F32)
        f.add_output(B.elementwise("mul", t, 0.707107))
    assert "double(0.70710700000000004);" in str(f)


def build_misc():
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Half)
        y = B.define_tensor([-1, 1], DataType.Half)
        s = B.reduction("sum", B.cast(x, F32), [1], keepdim=True)
        m = B.reduction("max", x, [0])
        e = B.expand(y, [-1, 7])
        z = B.elementwise("where", B.elementwise("gt", x, 0.0), x, B.elementwise("neg", x))
        f.add_output(B.cast(B.elementwise("add", s, B.cast(e, F32)), DataType.Half))
        f.add_output(m)
        f.add_output(B.squeeze(B.permute(B.unsqueeze(z, 0), [0, 2, 1]), [0]))
        f.add_output(B.full([2, 3], 1.5, F32))
    return f


def test_misc_ops_golden():
    f = build_misc()
    verify(f)
    text = str(f)
    for piece in ["reduction( ", "op = add, initial value = double(0), allreduce = false )",
                  "op = max, initial value = double(-inf)", "expand( ", "where(", "= -T",
                  "(float)(T", "(__half)(T", "squeeze( ", "permute( ", "full({2, 3}, float(1.5));"]:
        assert piece in text, piece
    check_golden("misc_ops", text)


def test_scheduled_transforms_golden():
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], F32)
        y = B.elementwise("exp", x)
        f.add_output(y)
    y.merge(0).split(0, 128).split(0, 4)
    y.parallelize(0, ParallelType.BIDx).parallelize(-1, ParallelType.TIDx)
    verify(f)
    text = str(f)
    assert text.count("  Split: ") == 2 and text.count("  Merge: ") == 1
    assert "iblockIdx.x" in text and "ithreadIdx.x" in text
    check_golden("scheduled_exp", text)


def test_verifier_catches_bad_transform_history():
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], F32)
        y = B.elementwise("exp", x)
        f.add_output(y)
    y.split(1, 4)
    y.domain.leaf.pop()  # lose the inner axis
    with pytest.raises(IRVerifyError, match="replaying its transforms"):
        verify(f)


def test_verifier_catches_rank_and_dtype_mismatch():
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], F32)
        y = B.elementwise("exp", x)
        f.add_output(y)
        rank1 = B.define_tensor([-1], F32)
    y.definition.inputs[0] = rank1
    with pytest.raises(IRVerifyError, match="rank"):
        verify(f)
    g = Fusion()
    with g:
        a = B.define_tensor([-1], F32)
        b = B.elementwise("add", a, a)
        g.add_output(b)
    b.dtype = DataType.Double
    with pytest.raises(IRVerifyError, match="computes in Double"):
        verify(g)


def test_verifier_catches_broadcast_and_reduction_flags():
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], F32)
        r = B.reduction("sum", x, [1])
        bc = B.broadcast(r, [False, True])
        f.add_output(bc)
    bc.definition.flags = [True, False]
    with pytest.raises(IRVerifyError, match="broadcast"):
        verify(f)
    bc.definition.flags = [False, True]
    r.definition.axes = [0]
    with pytest.raises(IRVerifyError, match="reduction axes are"):
        verify(f)


def test_verifier_catches_defined_input_and_order():
    f = Fusion()
    with f:
        x = B.define_tensor([-1], F32)
        y = B.elementwise("neg", x)
        z = B.elementwise("exp", y)
        f.add_output(z)
    f.exprs.reverse()
    with pytest.raises(IRVerifyError, match="not topological"):
        verify(f)
    f.exprs.reverse()
    f.inputs.append(y)
    with pytest.raises(IRVerifyError, match="has a definition"):
        verify(f)
