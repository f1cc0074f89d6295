"""A raw IR Fusion edited after it ran must not replay the plan of its earlier form."""
import pytest
import torch

from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B
from pyfuser.runtime import dispatch


@pytest.mark.parametrize("mode", ["evaluator", "interpret"])
def test_output_added_after_execute_is_computed(monkeypatch, mode):
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        f.add_output(B.elementwise("exp", x))
    a = torch.randn(3, 4)
    (first,) = dispatch.execute_fusion(f, [a])
    torch.testing.assert_close(first, torch.exp(a))
    with f:
        f.add_output(B.elementwise("neg", x))
    outs = dispatch.execute_fusion(f, [a])
    assert len(outs) == 2
    torch.testing.assert_close(outs[0], torch.exp(a))
    torch.testing.assert_close(outs[1], -a)
