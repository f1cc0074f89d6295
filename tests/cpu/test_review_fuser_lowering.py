"""Review: lowering-table cases against eager (dtypes and values exactly), through pyfuser.jit
with both CPU executors; a case eager rejects must raise through the fuser too."""
import pytest
import torch
import torch.nn.functional as F

from pyfuser.frontend.torchscript.fuse_api import jit

from test_review_fuser_aliasing import check

IA = torch.tensor([-7, -3, -1, 0, 2, 5, 9])
IB = torch.tensor([2, -2, 3, -3, 4, -4, 3])
FA = torch.tensor([-7.5, -3., -1., 0.5, 2., 5., 9.])
FB = torch.tensor([2., -2., 3., -3., 4., -4., 3.])
BT = torch.tensor([True, False, True, False, True, False, True])


def _raises_like_eager(fn, *args):
    s = torch.jit.script(fn)
    with pytest.raises(Exception):
        s(*args)
    for mode in ("evaluator", "interpret"):
        f = jit(s, cpu_executor=mode)
        for _ in range(2):
            with pytest.raises(Exception, match="negative integer powers|mixed dtype|expected|alpha"):
                f(*args)


# ----- pow: integral tensor to a negative integral scalar raises in eager --------------------
def _pow_neg_const(a):
    return torch.pow(a, -1) + 1


def _pow_int_arg(a, e: int):
    return torch.pow(a, e) + 1


def _pow_tensor_exp(a, b):
    return torch.pow(a, b)


def _add_alpha_float(a, b):
    return torch.add(a, b, alpha=2.5)


def test_add_alpha_on_bool_and_int():
    check(_add_alpha, (BT, BT), (BT, IA), (IA, BT), (IA, IB), (FA, FB))
    s = torch.jit.script(_add_alpha_float)
    for mode in ("evaluator", "interpret"):
        f = jit(s, cpu_executor=mode)
        with pytest.raises(Exception, match="alpha must not be a floating"):
            f(IA, IB)
    check(_add_alpha_float, (FA, FB), (IA, FB))


def test_pow_int_negative_scalar_exponent_raises():
    _raises_like_eager(_pow_neg_const, IB)
    _raises_like_eager(_pow_int_arg, IB, -2)
    check(_pow_int_arg, (IB, 3), (FA, -2))
    check(_pow_tensor_exp, (IA, IB), (IA, FB.abs()))    # tensor exponent: 0s, no error
    f = jit(torch.jit.script(_pow_neg_const))
    assert f.num_groups == 1
    with pytest.raises(Exception):
        f(IB)
    assert "negative integer powers" in f.last_run.fallbacks[-1]["reason"]


# ----- batch_norm inference: result in x's dtype; eager's mixed-dtype rules ------------------
def _bn(x, rm, rv, w, b):
    return torch.relu(F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-3))


def _bn_none(x, rm, rv):
    return F.batch_norm(x, rm, rv, None, None, False, 0.1, 1e-5) + 1


def test_batch_norm_inference_dtypes():
    p = [torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3)]
    x = torch.randn(2, 3, 4)
    check(_bn, (x.half(), *p), (x.bfloat16(), *p), (x, *p), (x.double(), *[t.double() for t in p]))
    check(_bn, (x.half(), *[t.half() for t in p]))
    check(_bn_none, (x, p[0], p[1]), (x.half(), p[0], p[1]))


def test_batch_norm_mixed_dtypes_eager_rejects_still_raise():
    p = [torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3)]
    _raises_like_eager(_bn, torch.randn(2, 3, 4), *[t.half() for t in p])
    _raises_like_eager(_bn, torch.randn(2, 3, 4).double(), *p)


# ----- cases that were already right (regression guards) -------------------------------------
def _add_alpha(a, b):
    return torch.add(a, b, alpha=2)


def _sub_alpha(a, b):
    return torch.sub(a, b, alpha=3)


def _rsub(a, b):
    return torch.rsub(a, b, alpha=2)


def _rsub_scalar(a):
    return 1.5 - a


def _div_trunc(a, b):
    return torch.div(a, b, rounding_mode="trunc")


def _div_floor(a, b):
    return torch.div(a, b, rounding_mode="floor")


def _div(a, b):
    return torch.div(a, b)


def _rem(a, b):
    return torch.remainder(a, b)


def _fmod(a, b):
    return torch.fmod(a, b)


def _masked_fill(x, m):
    return x.masked_fill(m, 2.7)


def _where_scalar(c, x):
    return torch.where(c, x, 0.0)


def _where_scalars(c):
    return torch.where(c, 1.5, 0)


def _clamp(x):
    return torch.clamp(x, -2.5, 3.5)


def _threshold(x):
    return torch.threshold(x, 1.5, 20.5)


def _hardtanh(x):
    return F.hardtanh(x, -2.0, 2.0)


def _type_as(x, y):
    return x.type_as(y) + 1


def _to_other(x, y):
    return x.to(y) * 2


def _flatten(x):
    return torch.flatten(x * 2, 1)


def _expand(x):
    return (x * 2).expand(3, -1) + 1


def _squeeze(x):
    return (x * 2).squeeze(1) + 1


def _softmax(x):
    return torch.softmax(x, -1, torch.float64)


@pytest.mark.parametrize("fn,args", [
    (_add_alpha, (IA, IB)), (_sub_alpha, (IA, IB)), (_rsub, (IA, IB)),
    (_rsub_scalar, (IA,)), (_div_trunc, (IA, IB)), (_div_trunc, (FA, FB)), (_div_floor, (IA, IB)),
    (_div_floor, (FA, FB)), (_div, (IA, IB)), (_rem, (IA, IB)), (_rem, (FA, FB)), (_fmod, (IA, IB)),
    (_fmod, (FA, FB)), (_masked_fill, (IA, BT)), (_where_scalar, (BT, IA)), (_where_scalars, (BT,)),
    (_clamp, (IA,)), (_threshold, (IA,)), (_hardtanh, (IA,)), (_type_as, (FA, IA)),
    (_to_other, (FA, IA)), (_flatten, (torch.randn(2, 3, 4),)), (_expand, (torch.randn(1, 4),)),
    (_squeeze, (torch.randn(2, 3),)), (_squeeze, (torch.randn(2, 1),)),
    (_softmax, (torch.randn(3, 4),)),
])
def test_lowering_matches_eager(fn, args):
    check(fn, args)
