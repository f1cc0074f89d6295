"""A corpus of small PyTorch programs for the TorchScript frontend tests.

Each entry is (name, mode, fn, make_args): mode "script" or "trace"; make_args() returns fresh
example arguments (a module object comes first for module entries, fn being the module).
`build(entry)` gives (torch.jit object, graph text). Values are chosen so that every program
is well defined (positive variances, nonzero divisors).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F


def _r(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g)


# ----- scripted functions ------------------------------------------------------------------
def s_add_mul(x, y):
    return (x + y) * y - 2.5


def s_if_else(x, n: int):
    if n > 2:
        y = x.relu()
    else:
        y = x.sigmoid()
    return y * n


def s_for_loop(x, n: int):
    acc = x
    for i in range(n):
        acc = acc * 0.5 + i
    return acc


def s_while(x):
    i = 0
    while i < 5 and bool(x.sum() < 100.0):
        x = x + 1.0
        i += 1
    return x, i


def s_list_ops(x):
    parts: List[torch.Tensor] = []
    for i in range(3):
        parts.append(x * i)
    return torch.cat(parts, 0), len(parts), parts[1]


def s_tuple_ops(x, t: Tuple[torch.Tensor, int]):
    a, k = t
    return (x + a * k, k + 1)


def s_constants(x):
    a = 1e-20
    b = -7
    c = float("inf")
    d = -float("inf")
    s = "he\"llo\n\t"
    flag = True
    return x * a + b, c, d, s, flag, math.pi, [1, -2, 3], [0.5, 1e10]


def s_nan(x):
    return torch.where(x > 0, x, torch.full_like(x, float("nan"))), float("nan")


def s_none_opt(x, y: Optional[torch.Tensor]):
    if y is None:
        return x * 2
    return x + y


def s_inplace(x):
    y = x.clone()
    y.add_(1.0)
    y.mul_(3)
    y.relu_()
    return y


def s_views(x):
    a = x.view(-1)
    b = x.permute(1, 0).contiguous()
    c = x.transpose(0, 1)[1:, ::2]
    d = x.unsqueeze(0).expand(3, -1, -1)
    e = x.reshape(2, -1).select(0, 1)
    return a, b, c, d, e


def s_reductions(x):
    return (x.sum(), x.mean(1), x.amax(0, keepdim=True), x.var(1, unbiased=False),
            torch.softmax(x, -1), x.argmax(1), x.std())


def s_norms(x, w, b):
    ln = F.layer_norm(x, [x.size(-1)], w, b, 1e-5)
    rm = torch.zeros(x.size(1))
    rv = torch.ones(x.size(1))
    bn = F.batch_norm(x, rm, rv, w, b, False, 0.1, 1e-5)
    return ln, bn


def s_int_float_mix(x, n: int, f: float, flag: bool):
    m = n * 2 + 1
    q = m // 3
    r = m % 3
    z = f / n
    if flag:
        z = z + 1.0
    return x * z + q - r, n / 2, -n, abs(n - 10), float(n) ** 2, int(f * 3)


def s_dtype_device(x):
    y = x.to(torch.float64)
    z = x.to(dtype=torch.int32, device=torch.device("cpu"))
    return y, z, x.dtype == torch.float32, x.device


def s_multi_out(x):
    a, b = torch.chunk(x, 2, dim=1)
    vals, idx = torch.max(x, 1)
    s = torch.split(x, [1, 2], 0)
    return a, b, vals, idx, s[0], s[1]


def s_where_clamp(x, y):
    return torch.where(x > y, x, y).clamp(-0.5, 0.5), torch.clamp(x, min=0.0)


def s_matmul(x, w):
    return torch.relu(x @ w + 1.0), torch.addmm(x, x, w.t(), beta=0.5, alpha=2.0)


def s_stack_sizes(x):
    sizes = x.size()
    n = sizes[0] * sizes[1]
    return torch.stack([x, x * 2], 1), n, x.dim(), x.numel()


def s_bool_ops(x, y):
    m = (x > 0) & (y < 0) | ~(x == y)
    return m, m.any(), m.sum(), torch.logical_xor(x > 0, y > 0)


def s_string_format(x, n: int):
    s = "value {} and {}".format(n, n + 1)
    return x + len(s), s


def s_dict(x):
    d: Dict[str, torch.Tensor] = {"a": x, "b": x * 2}
    return d["a"] + d["b"], len(d)


def s_nested_if_loop(x, n: int):
    out = x
    for i in range(n):
        if i % 2 == 0:
            out = out + i
        else:
            if i > 2:
                out = out * 0.5
            else:
                out = out - 1.0
    return out


def s_int_list_arg(x, dims: List[int]):
    return x.sum(dims), x.permute(dims[::-1] + [2]) if len(dims) == 2 else x


def s_comparisons(a: int, b: float):
    return a < b, a == 3, b >= 1.5, a != 2, min(a, 4), max(b, 0.25)


def s_raise_ok(x, n: int):
    if n < 0:
        raise ValueError("negative n")
    return x * n


def s_scalar_tensor(x):
    t = torch.tensor(3.0)
    k = torch.tensor([1, 2, 3])
    return x * t, k.sum(), x.sum().item()


def s_activations(x):
    return (F.gelu(x), F.silu(x), torch.tanh(x), F.leaky_relu(x, 0.2), F.hardtanh(x),
            torch.exp(x).log1p(), x.abs().sqrt().rsqrt())


def s_type_conv(x):
    i = x.to(torch.int64)
    h = x.half()
    return i * 2, h.float() + 1, (i % 3).to(torch.bool), x.to(torch.bfloat16)


def s_masked(x):
    y = x.masked_fill(x < 0, 0.0)
    z = torch.zeros_like(x)
    z[0] = 5.0
    return y, z, x[x > 0].sum()


def s_optional_int(x, n: Optional[int]):
    if n is not None:
        return x * n
    return x


# ----- traced functions ----------------------------------------------------------------------
def t_elementwise(x, y):
    return (x * y + x).relu() * 2


def t_tensor_consts(x):
    return x + torch.tensor([1.0, 2.0, 3.0]), x * torch.tensor(5)


def t_reduce_norm(x):
    return F.softmax(x, -1).sum(0), F.layer_norm(x, [3])


def t_multi_out(x):
    a, b = x.chunk(2, 0)
    return a * 2, b + 1, a.mean()


def t_inplace(x):
    y = x * 1
    y.add_(2)
    y.sigmoid_()
    return y


def t_views(x):
    return x.t().reshape(-1), x[:, 1:].contiguous(), x.unsqueeze(-1) * x.unsqueeze(-2)


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.lin(x)))


class _Conv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.gn = torch.nn.GroupNorm(1, 3)

    def forward(self, x):
        return self.gn(self.conv(x)).flatten(1)


def _module(cls):
    torch.manual_seed(0)
    m = cls().eval()
    if hasattr(m, "bn"):
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2)
    return m


CORPUS = [
    ("add_mul", "script", s_add_mul, lambda: (_r(3, 4), _r(3, 4, seed=1))),
    ("if_else_hi", "script", s_if_else, lambda: (_r(5), 3)),
    ("if_else_lo", "script", s_if_else, lambda: (_r(5), 1)),
    ("for_loop", "script", s_for_loop, lambda: (_r(2, 3), 4)),
    ("while", "script", s_while, lambda: (_r(4),)),
    ("list_ops", "script", s_list_ops, lambda: (_r(2, 2),)),
    ("tuple_ops", "script", s_tuple_ops, lambda: (_r(3), (_r(3, seed=2), 4))),
    ("constants", "script", s_constants, lambda: (_r(3),)),
    ("nan", "script", s_nan, lambda: (_r(6),)),
    ("none_opt_none", "script", s_none_opt, lambda: (_r(3), None)),
    ("none_opt_some", "script", s_none_opt, lambda: (_r(3), _r(3, seed=5))),
    ("inplace", "script", s_inplace, lambda: (_r(4, 3),)),
    ("views", "script", s_views, lambda: (_r(4, 6),)),
    ("reductions", "script", s_reductions, lambda: (_r(4, 5),)),
    ("norms", "script", s_norms, lambda: (_r(4, 6), _r(6, seed=3), _r(6, seed=4))),
    ("int_float_mix", "script", s_int_float_mix, lambda: (_r(3), 7, 2.5, True)),
    ("dtype_device", "script", s_dtype_device, lambda: (_r(3) * 10,)),
    ("multi_out", "script", s_multi_out, lambda: (_r(3, 4),)),
    ("where_clamp", "script", s_where_clamp, lambda: (_r(5), _r(5, seed=9))),
    ("matmul", "script", s_matmul, lambda: (_r(3, 3), _r(3, 3, seed=7))),
    ("stack_sizes", "script", s_stack_sizes, lambda: (_r(2, 3),)),
    ("bool_ops", "script", s_bool_ops, lambda: (_r(6), _r(6, seed=8))),
    ("string_format", "script", s_string_format, lambda: (_r(2), 41)),
    ("dict", "script", s_dict, lambda: (_r(3),)),
    ("nested_if_loop", "script", s_nested_if_loop, lambda: (_r(3), 5)),
    ("int_list_arg", "script", s_int_list_arg, lambda: (_r(2, 3, 4), [0, 1])),
    ("comparisons", "script", s_comparisons, lambda: (3, 1.5)),
    ("raise_ok", "script", s_raise_ok, lambda: (_r(3), 2)),
    ("scalar_tensor", "script", s_scalar_tensor, lambda: (_r(3),)),
    ("activations", "script", s_activations, lambda: (_r(8),)),
    ("type_conv", "script", s_type_conv, lambda: (_r(5) * 4,)),
    ("masked", "script", s_masked, lambda: (_r(3, 2),)),
    ("optional_int_none", "script", s_optional_int, lambda: (_r(2), None)),
    ("optional_int_some", "script", s_optional_int, lambda: (_r(2), 3)),
    ("t_elementwise", "trace", t_elementwise, lambda: (_r(4, 5), _r(4, 5, seed=1))),
    ("t_tensor_consts", "trace", t_tensor_consts, lambda: (_r(3),)),
    ("t_reduce_norm", "trace", t_reduce_norm, lambda: (_r(2, 3),)),
    ("t_multi_out", "trace", t_multi_out, lambda: (_r(4, 2),)),
    ("t_inplace", "trace", t_inplace, lambda: (_r(3, 3),)),
    ("t_views", "trace", t_views, lambda: (_r(3, 4),)),
    ("m_mlp_script", "script", _module(_Mlp), lambda: (_r(5, 3),)),
    ("m_mlp_trace", "trace", _module(_Mlp), lambda: (_r(5, 3),)),
    ("m_conv_script", "script", _module(_Conv), lambda: (_r(2, 2, 5, 5),)),
    ("m_conv_trace", "trace", _module(_Conv), lambda: (_r(2, 2, 5, 5),)),
]


def build(entry):
    """(scripted or traced object, IR text of its inlined graph)."""
    name, mode, fn, make_args = entry
    if mode == "script":
        obj = torch.jit.script(fn)
    else:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.jit.trace(fn, make_args(), check_trace=False)
    return obj, str(obj.inlined_graph)


def is_module(entry) -> bool:
    return isinstance(entry[2], torch.nn.Module)


def _te_fn(x, y):
    a = x * y + 1.0
    b = a.relu() * x
    return b.sigmoid() + y


def _ad_fn(x, y):
    return (x * y).sin() * y


def optimized_graph_texts() -> dict:
    """Graphs after PyTorch's own optimisation: a TensorExpr fusion group (CPU fuser forced
    on, flags restored) and a DifferentiableGraph; each printed with `with ... = graph(`."""
    C = torch._C
    saved = (C._jit_can_fuse_on_cpu(), C._jit_get_te_must_use_llvm_cpu(),
             C._jit_texpr_fuser_enabled())
    out = {}
    try:
        C._jit_override_can_fuse_on_cpu(True)
        C._jit_set_te_must_use_llvm_cpu(False)
        C._jit_set_texpr_fuser_enabled(True)
        f = torch.jit.script(_te_fn)
        x, y = _r(4, 5), _r(4, 5, seed=1)
        for _ in range(3):
            f(x, y)
        out["te"] = (str(torch.jit.last_executed_optimized_graph()), _te_fn, (x, y))
        g = torch.jit.script(_ad_fn)
        xr = _r(3).requires_grad_()
        for _ in range(3):
            g(xr, xr)
        out["autodiff"] = (str(torch.jit.last_executed_optimized_graph()), _ad_fn,
                           (xr.detach(), xr.detach()))
    finally:
        C._jit_override_can_fuse_on_cpu(saved[0])
        C._jit_set_te_must_use_llvm_cpu(saved[1])
        C._jit_set_texpr_fuser_enabled(saved[2])
    return out
