"""Review: aliasing the passes must see (never a silent wrong result), checked against eager.

Each case runs the scripted function directly and through pyfuser.jit (evaluator and
interpret executors, twice: lowering call and fused call) and compares outputs and mutated
inputs exactly (dtype and values)."""
from typing import Dict, List, Optional

import pytest
import torch
import torch.nn.functional as F

from pyfuser.frontend.torchscript.fuse_api import jit

MODES = ("evaluator", "interpret")


def _clone(a):
    if isinstance(a, torch.Tensor):
        return a.clone()
    if isinstance(a, (list, tuple)):
        return type(a)(_clone(x) for x in a)
    return a


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, equal_nan=True)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def check(fn, *arg_sets, raises_ok=False):
    """Fused == eager on every argument set; with raises_ok, a loud error also passes."""
    s = torch.jit.script(fn)
    for mode in MODES:
        f = jit(s, cpu_executor=mode)
        for args in arg_sets:
            for _ in range(2):
                ea, fa = _clone(args), _clone(args)
                expected = s(*ea)
                try:
                    got = f(*fa)
                except Exception:
                    if raises_ok:
                        continue
                    raise
                _same(expected, got)
                _same(ea, fa)


def r(*s):
    return torch.randn(*s)


# ----- out= overloads: the written `out` argument is a write (was: DCE'd / reordered) --------
def _out_then_read(x, y):
    c = x * 2
    torch.add(x, y, out=c)
    d = c + 1
    return d


def _out_view(x, y):
    c = x * 2
    v = c.view(-1)
    torch.mul(x, y, out=c)
    return v + 1


def _out_cse(x, y):
    c = x * 2
    d = c + 1
    torch.mm(x, y, out=c)
    e = c + 1
    return d, e


@pytest.mark.parametrize("fn,shape", [(_out_then_read, (3,)), (_out_view, (3,)), (_out_cse, (3, 3))])
def test_out_overload_is_a_write(fn, shape):
    check(fn, (r(*shape), r(*shape)), raises_ok=True)
    f = jit(torch.jit.script(fn))
    outs = [n for n in f.graph.nodes() if n.kind in ("aten::add", "aten::mul", "aten::mm")
            and len(n.inputs) >= 3]
    assert outs, "the out= call must not be dropped"


# ----- batch_norm / instance_norm update running stats without saying so in the schema -----
def _bn_move(x, rm, rv):
    a = rm * 2
    y = F.batch_norm(x, rm, rv, None, None, True, 0.1, 1e-5)
    b = a + 1
    return y, b


def _in_move(x, rm, rv):
    a = rm * 2
    y = F.instance_norm(x, rm, rv, None, None, True, 0.1, 1e-5)
    b = a + 1
    return y, b


def test_training_batch_norm_writes_running_stats():
    check(_bn_move, (r(4, 3), r(3), r(3).abs()))
    check(_in_move, (r(4, 3, 5), r(3), r(3).abs()))


_BN_IR = """
graph(%x : Tensor, %rm : Tensor, %rv : Tensor):
  %none : NoneType = prim::Constant()
  %t : bool = prim::Constant[value=1]()
  %m : float = prim::Constant[value=0.1]()
  %e : float = prim::Constant[value=1e-05]()
  %two : int = prim::Constant[value=2]()
  %y : Tensor = aten::batch_norm(%x, %none, %none, %rm, %rv, %t, %m, %e, %t)
  %z : Tensor = aten::mul(%x, %two)
  return (%z)
"""


def test_unused_training_batch_norm_is_not_dead_code():
    """Its running statistics are written: kept (fused, the group writes them, or eager)."""
    f = jit(_BN_IR)
    assert any(n.kind == "aten::batch_norm" or (n.kind == "prim::PyfuserGroup" and any(
        m.kind == "aten::batch_norm" for m in n.g("Subgraph").nodes())) for n in f.graph.nodes())
    x, rm, rv = r(4, 3), torch.zeros(3), torch.ones(3)
    rm2, rv2 = rm.clone(), rv.clone()
    F.batch_norm(x, rm2, rv2, None, None, True, 0.1, 1e-5)
    f(x, rm, rv)
    torch.testing.assert_close(rm, rm2)
    torch.testing.assert_close(rv, rv2)


def _bn_dce(x, rm, rv):
    y = F.batch_norm(x, rm, rv, None, None, True, 0.1, 1e-5)
    return x * 2


def test_unused_training_batch_norm_from_script():
    """Python eager updates the running statistics even though `y` is unused (TorchScript's own
    executor drops the call as dead code); pyfuser follows eager."""
    args = (r(4, 3), r(3), r(3).abs())
    for mode in MODES:
        f = jit(torch.jit.script(_bn_dce), cpu_executor=mode)
        ea, fa = _clone(args), _clone(args)
        _same(_bn_dce(*ea), f(*fa))
        _same(ea, fa)
        assert not torch.equal(fa[1], args[1])     # the running mean was updated


# ----- values stored into containers (`t(a -> *)`) and taken out of them ----------------------
def _append_alias(x):
    a = x + 1
    l: List[torch.Tensor] = []
    l.append(a)
    l[0].mul_(2)
    return a * 3


def _append_inplace(x):
    a = x + 1
    l: List[torch.Tensor] = []
    l.append(a)
    a.add_(1)
    return l[0] * 1.5


def _setitem_inplace(x):
    a = x + 1
    l: List[torch.Tensor] = [x]
    l[0] = a
    a.add_(1)
    return l[0] * 1.5


def _insert_inplace(x):
    a = x + 1
    l: List[torch.Tensor] = [x]
    l.insert(0, a)
    a.add_(1)
    return l[0] * 1.5


def _dict_inplace(x):
    a = x + 1
    d: Dict[str, torch.Tensor] = {}
    d["k"] = a
    a.add_(1)
    return d["k"] * 1.5


def _dict_write(x):
    a = x + 1
    d: Dict[str, torch.Tensor] = {}
    d["k"] = a
    d["k"].mul_(2)
    return a * 3


def _chunk_alias(x):
    a = x + 1
    b, c = a.chunk(2)
    b.mul_(2)
    return a * 3


def _unbind_alias(x):
    a = x + 1
    l = a.unbind(0)
    l[0].mul_(2)
    return a * 3


def _split_alias(x):
    a = x + 1
    l = torch.split(a, 1)
    l[0].mul_(2)
    return a * 3


def _expand_unbind_siblings(x):
    a = x + 1
    b, c = a.expand(2, 3).unbind(0)
    b.mul_(2)
    return c + 0.5


def _optional_alias(x, flag: bool):
    a = x + 1
    o: Optional[torch.Tensor] = None
    if flag:
        o = a
    if o is not None:
        o.mul_(2)
    return a * 3


@pytest.mark.parametrize("fn", [_append_alias, _append_inplace, _setitem_inplace, _insert_inplace,
                                _dict_inplace, _dict_write, _chunk_alias, _expand_unbind_siblings])
def test_container_and_split_aliases(fn):
    check(fn, (r(4),) if fn is _chunk_alias else (r(3),))


@pytest.mark.parametrize("fn", [_unbind_alias, _split_alias])
def test_list_of_views_aliases(fn):
    check(fn, (r(2, 3),))


def test_unchecked_cast_aliases_its_input():
    check(_optional_alias, (r(3), True), (r(3), False))


# ----- patterns that were already right (regression guards) ----------------------------------
def _view_then_mul_(x):
    a = x * 2
    b = a.view(-1)
    a.mul_(3)
    return b


def _mutate_input(x, y):
    x.add_(y)
    return x * 2


def _mutate_input_view(x, y):
    v = x[0]
    v.mul_(y)
    return x + 1


def _add_alias_view(x):
    a = x + 1
    a.add_(a)
    return a * 2


def _loop_view_inplace(x, n: int):
    a = x + 1
    b = a.view(-1)
    for i in range(n):
        a.mul_(2)
    return b * 3


def _inplace_in_if_on_view(x, flag: bool):
    a = x + 1
    b = a[0]
    if flag:
        b.mul_(10)
    return a * 3


def _horiz_dep(x):
    a = x * 2
    m = torch.mm(a, a)
    b = x + m
    return a, b


def _loop_group(x, n: int):
    y = x
    for i in range(n):
        y = torch.relu(y * 2 - 1)
    return y


def _to_same_then_inplace(x):
    a = x * 1.5
    z = a.to(torch.float32)
    z.mul_(2)
    return a + 0


def test_regressions_already_right():
    check(_view_then_mul_, (r(3, 4),))
    check(_mutate_input, (r(3, 4), r(3, 4)))
    check(_mutate_input_view, (r(3, 4), r(4)))
    check(_add_alias_view, (r(4, 4),))
    check(_loop_view_inplace, (r(3, 2), 3))
    check(_inplace_in_if_on_view, (r(3, 2), True), (r(3, 2), False))
    check(_horiz_dep, (r(3, 3),))
    check(_loop_group, (r(3), 3), (r(3), 0))
    check(_to_same_then_inplace, (r(3),))


def _min_of_two(a, b):
    return torch.min(a * 2, b) + 1


def test_overload_torch_matched_decides_what_a_node_writes():
    """torch.min(a, b) (aten::min.other) read from a torch object is the pure overload: it
    fuses (T5's relative-position buckets). From IR text `aten::min(%a, %b)` could also be
    `min(a, out=b)`: it stays out of groups, as a writer."""
    import pyfuser
    a, b = torch.randint(0, 9, (4, 5)), torch.randint(0, 9, (4, 5))
    f = pyfuser.jit(torch.jit.script(_min_of_two))
    assert torch.equal(f(a, b), _min_of_two(a, b))
    assert f.last_run.groups == 1 and f.last_run.fallbacks == [], f.last_run
    g = jit("""graph(%a : Tensor, %b : Tensor):
  %m : Tensor = aten::min(%a, %b)
  return (%m)""")
    assert torch.equal(g(a, b), torch.min(a, b))
    assert any("writes a tensor in place" in fb["reason"] for fb in g.last_run.fallbacks)
