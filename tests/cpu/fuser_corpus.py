"""Programs for the graph fuser's tests: (name, function, inputs, expected group count).

Each function is scripted (or traced, marked `traced=True`); `inputs()` makes fresh CPU
inputs (fresh, because some programs mutate their inputs). `groups` is the exact number of
fusion groups the fuser must form. Families: in-place chains, control flow, several
outputs, unfusible ops between fusible ones, int/bool/float mixes, broadcasts, views.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as F

CASES: list = []


@dataclass
class Case:
    name: str
    fn: Callable
    inputs: Callable
    groups: int
    traced: bool = False


def case(groups: int, *shapes, traced: bool = False, make=None):
    def register(fn):
        def inputs():
            g = torch.Generator().manual_seed(len(fn.__name__))
            if make is not None:
                return make(g)
            return [torch.randn(s, generator=g) for s in shapes]
        CASES.append(Case(fn.__name__, fn, inputs, groups, traced))
        return fn
    return register


def _ints(g, *shape):
    return torch.randint(1, 9, shape, generator=g)


# ---- plain pointwise chains ------------------------------------------------------------------
@case(1, (4, 5), (4, 5), (4, 5))
def add_mul(a, b, c):
    return (a + b) * c


@case(1, (4, 5), (4, 5))
def act_chain(x, y):
    return torch.sigmoid(torch.relu(x - y) * 2.0).tanh() + F.gelu(y)


@case(1, (3, 4), (3, 4))
def two_outputs(x, y):
    s = x + y
    return s * 2, s.exp()


@case(1, (3, 4), (3, 4))
def shared_input_siblings(x, y):
    return x.sin() + 1, x.cos() * y


@case(1, (3, 4))
def reused_intermediate(x):
    a = x * x
    b = a + 1
    return a - b, b


# ---- in-place chains ---------------------------------------------------------------------------
@case(1, (4, 5), (4, 5), (4, 5))
def inplace_chain(a, b, c):
    t = a * 1.0
    t.add_(b)
    t.mul_(c)
    return t.relu_()


@case(1, (4, 5), (4, 5))
def inplace_activations(x, y):
    t = x + y
    t.sigmoid_()
    t.tanh_()
    t.clamp_(-0.5, 0.5)
    return t


@case(1, (4, 5), (4, 5))
def inplace_div_sub(x, y):
    t = x.exp()
    t.div_(y.abs() + 1)
    t.sub_(1.5)
    return t


@case(1, make=lambda g: [_ints(g, 4, 5).int(), _ints(g, 4, 5)])
def inplace_keeps_dtype(x, y):
    t = x * 1
    t.add_(y)
    t.mul_(y)
    return t


@case(1, (4, 5), (4, 5))
def inplace_then_reuse(x, y):
    t = x + 1
    u = t * 2
    t.mul_(y)
    return t + u


@case(2, (4, 5))
def inplace_on_input(x):
    y = x * 2
    x.add_(1)
    return y + x


@case(2, (4, 5))
def inplace_through_view(x):
    t = x + 1
    v = t.view(20)
    t.mul_(2)
    return v * 3


@case(2, (4, 5))
def inplace_list_captured(x):
    t = x + 1
    lst = [t]
    t.mul_(2)
    return lst[0] + t


# ---- unsupported ops between fusible ones ----------------------------------------------------
@case(2, (4, 5))
def cumsum_between(x):
    a = x + 1
    b = torch.cumsum(a, 1)
    return a * b


@case(2, (4, 5), (5, 3))
def matmul_between(x, w):
    a = torch.relu(x * 2)
    m = torch.matmul(a, w)
    return m.sigmoid() + 1


@case(1, (4, 5))
def reduction_between(x):
    a = x.exp()
    s = a.sum(1, keepdim=True)
    return a / s


@case(1, (4, 5))
def group_moves_past_unfusible(x):
    a = x + 1
    c = torch.cumsum(x, 0)
    b = a * 2
    return b, c


@case(1, (4, 6))
def softmax_between(x):
    return torch.softmax(x * 2, 1) + 1


# ---- mixes of dtypes --------------------------------------------------------------------------
@case(1, make=lambda g: [_ints(g, 4, 5), torch.randn(4, 5, generator=g)])
def int_float_mix(i, f):
    return (i + f) * 2 - i


@case(1, make=lambda g: [torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)])
def bool_mask(x, y):
    m = x > y
    return torch.where(m, x, y) + m.float()


@case(1, make=lambda g: [_ints(g, 4, 5).int(), _ints(g, 4, 5)])
def int_only(a, b):
    return (a + b) * a - b


@case(1, make=lambda g: [torch.randn(4, 5, generator=g).double(), torch.randn(4, 5, generator=g)])
def double_float(a, b):
    return a * b + 1.0


@case(1, make=lambda g: [torch.randn(4, 5, generator=g), 3])
def scalar_int_input(x, k: int):
    return x * k + k


@case(1, make=lambda g: [torch.randn(4, 5, generator=g), 0.5])
def scalar_float_input(x, s: float):
    return (x + s).relu() * s


@case(1, make=lambda g: [torch.randn(4, 5, generator=g)])
def casts(x):
    return (x * 3).to(torch.int32).to(torch.float64) + 0.5


@case(1, make=lambda g: [torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)])
def logical_ops(x, y):
    a = (x > 0) & (y < 0)
    b = (x < 0) | (y > 0)
    return torch.logical_xor(a, b), a.int() + b.int()


# ---- broadcasts -------------------------------------------------------------------------------
@case(1, (4, 5), (5,), (4, 1))
def broadcast_add(x, b, c):
    return (x + b) * c


@case(1, (2, 3, 4), (1, 3, 1))
def broadcast_3d(x, s):
    return torch.relu(x * s + s)


@case(1, (1, 5), (4, 1))
def broadcast_outer(a, b):
    return a * b + a


# ---- views ------------------------------------------------------------------------------------
@case(1, (4, 6))
def view_in_middle(x):
    return (x + 1).view(2, 12) * 2


@case(1, (4, 6))
def reshape_permute(x):
    return (x.exp().reshape(2, 2, 6).permute(2, 0, 1) + 1).sigmoid()


@case(1, (4, 6), (6,))
def unsqueeze_expand(x, b):
    return x * b.unsqueeze(0).expand(4, 6)


@case(1, (3, 4))
def transpose_t(x):
    return (x.t() * 2).transpose(0, 1) + x


@case(1, (1, 4, 1))
def squeeze_flatten(x):
    return x.squeeze().relu() + x.flatten().sin()


@case(0, (4, 6))
def lone_view(x):
    return x.view(24)


# ---- control flow -----------------------------------------------------------------------------
@case(2, make=lambda g: [torch.randn(4, 5, generator=g), True])
def if_fusible_inside(x, flag: bool):
    if flag:
        y = (x + 1) * 2
    else:
        y = (x - 1).relu()
    return y


@case(3, make=lambda g: [torch.randn(4, 5, generator=g), 3])
def loop_fusible_inside(x, n: int):
    y = x * 1.5
    for _ in range(n):
        y = torch.tanh(y) * 0.5 + x
    return y + 1


@case(3, make=lambda g: [torch.randn(4, 5, generator=g), False])
def if_both_sides(x, flag: bool):
    a = x.exp()
    if flag:
        a = a + 1
    return a * 2


@case(2, make=lambda g: [torch.randn(3, 4, generator=g), 2])
def loop_with_inplace(x, n: int):
    acc = x * 0.0
    for _ in range(n):
        acc.add_(x)
    return acc.relu() + 1


# ---- traced -----------------------------------------------------------------------------------
@case(1, (4, 5), (4, 5), traced=True)
def traced_chain(x, y):
    return torch.relu(x * y + 1.0) - y


@case(2, (4, 8), (3, 8), (3,), traced=True)
def traced_linear_bias(x, w, b):
    return F.gelu(F.linear(x * 2, w, b))


@case(1, (1, 2, 5, 5), (3, 2, 3, 3), (3,), traced=True)
def traced_conv_bias_relu(x, w, b):
    return torch.relu(F.conv2d(x, w, b))


@case(1, (4, 5), (4, 5))
def wide_outputs(x, y):
    return x + y, x - y, x * y, x / (y.abs() + 1)


@case(1, (4, 5))
def dropout_eval(x):
    return F.dropout(x * 2, 0.5, False) + 1
