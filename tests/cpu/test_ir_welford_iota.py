"""Welford and iota: built with the builder, evaluated by the reference evaluator."""
import pytest
import torch

from pyfuser.errors import FusionDefinitionError
from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.ir.evaluator import evaluate
from pyfuser.ir.verifier import verify


def test_welford_matches_var_mean():
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        avg, m2, n = B.welford(x, [1])
        for t in (avg, m2, n):
            f.add_output(t)
    verify(f)
    xt = torch.randn(5, 7, dtype=torch.float32)
    avg_t, m2_t, n_t = evaluate(f, [xt])
    var, mean = torch.var_mean(xt, dim=1, correction=0)
    torch.testing.assert_close(avg_t, mean)
    torch.testing.assert_close(m2_t, var * 7)
    assert n_t.dtype == torch.int64 and bool((n_t == 7).all())
    assert "Welford" in str(f)


def test_welford_rejects_integers():
    with Fusion():
        x = B.define_tensor([-1], DataType.Int32)
        with pytest.raises(FusionDefinitionError, match="welford"):
            B.welford(x, [0])


def test_iota_with_symbolic_length():
    f = Fusion()
    with f:
        n = B.symbolic_scalar(DataType.Int)
        f.add_input(n)
        f.add_output(B.iota(n, 3, 2))
    (out,) = evaluate(f, [5])
    assert torch.equal(out, torch.tensor([3, 5, 7, 9, 11]))


def test_iota_length_must_be_int():
    with Fusion():
        with pytest.raises(FusionDefinitionError, match="iota"):
            B.iota(2.5)
