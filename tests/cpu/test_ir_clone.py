"""ir/clone.deep_clone builds the same graph copy.deepcopy does: same printout, no object shared
with the original except what the memo pre-seeds, memo entries for every copied IR object, and
hooks (__deepcopy__) of non-plain classes still honoured."""
import copy
import os
import sys

import pytest
import torch

from pyfuser.ir import Fusion
from pyfuser.ir import builder as B
from pyfuser.ir.base import Val
from pyfuser.ir.clone import deep_clone
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.ops import OPS
from pyfuser.ir.printer import print_fusion

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

_BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "pointwise.py")


def _bench_fusions():
    mod = load_module_from_path("bench_pointwise_defs", _BENCH, fresh=True, register=False)
    return [define().ir_fusion for _, define, *_ in mod.CASES]


def _views_and_scalars():
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        s = B.symbolic_scalar(DataType.Double)
        f.add_input(s)
        y = B.elementwise("mul", B.permute(x, [1, 0]), s)
        f.add_output(B.reshape(y, [-1]))
    return f


@pytest.mark.parametrize("which", range(6))
def test_same_graph_as_deepcopy(which):
    fusion = (_bench_fusions() + [_views_and_scalars()])[which]
    fusion.execute_cache_probe = torch.float32          # an atomic attribute rides along
    memo_a = {id(info): info for info in OPS.values()}
    memo_b = dict(memo_a)
    a = copy.deepcopy(fusion, memo_a)
    b = deep_clone(fusion, memo_b)
    assert print_fusion(b) == print_fusion(a) == print_fusion(fusion)
    orig_ids = {id(v) for v in fusion.vals} | {id(e) for e in fusion.exprs}
    assert not orig_ids & ({id(v) for v in b.vals} | {id(e) for e in b.exprs})
    for v in fusion.vals:                      # every val has a copy, found through the memo
        assert isinstance(memo_b[id(v)], Val) and memo_b[id(v)] is not v
    for e_orig, e_new in zip(fusion.exprs, b.exprs):
        assert memo_b[id(e_orig)] is e_new
        assert [memo_b[id(o)] for o in e_orig.outputs] == list(e_new.outputs)
        if getattr(e_orig, "op", None) in OPS.values():
            assert e_new.op is e_orig.op       # pre-seeded objects are shared, not copied
    assert b.execute_cache_probe is torch.float32


def test_hooks_of_other_classes_still_run():
    class Hooked:
        def __deepcopy__(self, memo):
            return "hooked"
    f = _views_and_scalars()
    f.extra = [Hooked(), (1, 2.5, "s")]
    b = deep_clone(f, {})
    assert b.extra[0] == "hooked" and b.extra[1] == (1, 2.5, "s") and b.extra is not f.extra
