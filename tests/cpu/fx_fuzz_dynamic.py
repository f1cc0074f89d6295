"""Dynamic-shape programs for the torch.compile backend's fuzzer (fx_fuzz.py's sibling): random
Python functions whose input axes are symbols, compiled once with `dynamic=True` (or, for about
one program in four, `dynamic=None` and `torch._dynamo.mark_dynamic` on the axes that vary) and
called at CALLS sets of sizes; fx_check_dynamic.py checks each call against eager and that the
graph was not compiled again.

A symbol is an axis size: one that varies takes CALLS different sizes (2 or more: Dynamo
specialises 0 and 1), a fixed one the same size each call. Under dynamic=True every axis of
size 2 or more is symbolic and Dynamo gives equal sizes of the first call one symbol (duck
sizing), so symbols have distinct first sizes; later calls may make two equal. Axes of size 1
stay 1 (broadcasts). Every line is run eagerly at every call's sizes as it is drawn, and a
line that fails at one of them is drawn again; a line refers to sizes through `.shape` (a
literal size of a varying axis fails at some call and is never kept).

Ops, besides fx_fuzz's pointwise ops, casts, where / clamp, reductions, views, literal slices,
cats, pads and in-place ops: slices with bounds computed from sizes (`x[:, :x.shape[1] - 1]`,
`x[..., 1:]`, negative starts, `x.shape[1] // 2`, ends past the size), `torch.arange` of a
size in masks, compares and arithmetic, Python floats (literals, `math.sqrt(x.shape[-1])`,
and float arguments of the function, which Dynamo passes as 0-dim float64 inputs; their value
changes between calls), expands to symbolic sizes, softmax / log_softmax / layer_norm / an RMS
norm / a mean written as `sum / shape` along symbolic axes, reshapes and flattens written with
sizes, and round trips through bfloat16 and half. About one program in six is a grad-mode
program (float32 inputs requiring grad, no in-place ops; the backward of the float outputs'
sum, every call). About three in ten are also replayed with dynamic=False (a static graph per
size, which share their regions' Fusions: a kernel planned at one size serves the others).

`generate(seed)` depends on the seed alone; `DynProgram.concrete(k)` is call k as an
fx_fuzz.Program (concrete shapes, the float arguments' values), which fx_check judges.
"""
from __future__ import annotations

import math
import random
import re
import warnings
from dataclasses import dataclass, field

import torch

import fx_fuzz as FZ
from fx_fuzz import BF16, F16, F32, DTYPE_NAME, TOLERANCE

CALLS = 3
SIZES = [2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17, 24, 31, 33]
FLOATS = [0.5, 0.37, -1.25, 2.5, 1e-3, 0.1234567, 3.0]
MAX_NUMEL = 2048


class Concrete(FZ.Program):
    """One call of a DynProgram: fx_fuzz.Program with Python float arguments after the tensors
    and `math` in the function's namespace."""
    floats: list = ()

    def make_inputs(self) -> list:
        return super().make_inputs() + list(self.floats)

    def function(self, gelu_formula: bool = False, float64: bool = False):
        f = super().function(gelu_formula, float64)
        f.__globals__["math"] = math
        return f


@dataclass
class DynProgram:
    seed: int
    source: str
    inputs: list            # (dims, dtype, layout): dims of symbol names and 1s
    sizes: dict             # symbol -> CALLS sizes
    floats: list            # per float argument, CALLS values
    grad: bool = False
    mark: bool = False      # dynamic=None and mark_dynamic on the varying axes
    loosest: torch.dtype = F32
    stats: dict = field(default_factory=dict)
    replay: bool = False    # also compiled with dynamic=False and called at each size

    def varying(self, sym) -> bool:
        return isinstance(sym, str) and len(set(self.sizes[sym])) > 1

    def shape(self, dims, k: int) -> tuple:
        return tuple(self.sizes[d][k] if isinstance(d, str) else d for d in dims)

    def concrete(self, k: int) -> Concrete:
        c = Concrete(self.seed, self.source,
                     [(self.shape(dims, k), dtype, layout) for dims, dtype, layout in self.inputs],
                     self.grad, input_seed=self.seed * CALLS + k, loosest=self.loosest)
        c.floats = [v[k] for v in self.floats]
        return c

    def function(self):
        return self.concrete(0).function()

    def describe(self) -> str:
        mode = "mark_dynamic" if self.mark else "dynamic=True"
        ins = ", ".join(f"x{i}: ({', '.join(map(str, dims))}) {DTYPE_NAME[d]} {lay}"
                        for i, (dims, d, lay) in enumerate(self.inputs))
        fl = ", ".join(f"s{i}: {v}" for i, v in enumerate(self.floats))
        return (f"seed {self.seed} ({mode}{', grad' if self.grad else ''}); sizes {self.sizes}; "
                f"inputs {ins}{'; ' + fl if fl else ''}\n{self.source}")


class _Builder(FZ._Builder):
    """fx_fuzz's builder with one environment per call: `env` (what fx_fuzz's generators read)
    is the first call's, and a line is kept only where it runs at every call's sizes."""

    def __init__(self, seed: int, grad: bool):
        super().__init__(seed, grad)
        self.envs = [self.env] + [{} for _ in range(CALLS - 1)]
        self.ns["math"] = math
        self.sizes: dict = {}         # symbol -> CALLS sizes
        self.floats: list = []        # per float argument, CALLS values
        self.float_envs = [{} for _ in range(CALLS)]

    def try_line(self, line, out, owned) -> bool:
        scopes = []
        for env, floats in zip(self.envs, self.float_envs):
            scope = {**env, **floats}
            try:
                with torch.set_grad_enabled(self.grad), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    exec(line, self.ns, scope)
            except Exception:  # noqa: BLE001
                return False
            if out is not None:
                v = scope[out]
                if not isinstance(v, torch.Tensor) or v.numel() > 4096:
                    return False
            scopes.append(scope)
        if out is not None:
            for env, scope in zip(self.envs, scopes):
                env[out] = scope[out]
        return self.keep(line, out, owned)

    def pick_all(self, pred):
        """A value n for which pred(n, env) holds in every call's environment."""
        names = [n for n in self.env if all(pred(n, env) for env in self.envs)]
        if not names:
            return None
        return names[-1] if self.r.random() < 0.5 else self.r.choice(names)


# ---- inputs ----------------------------------------------------------------------------------

def _new_symbol(b: _Builder) -> str:
    firsts = {v[0] for v in b.sizes.values()}
    first = b.r.choice([s for s in SIZES if s not in firsts])
    if b.r.random() < 0.7:
        rest = [b.r.choice([s for s in SIZES if s != first]) for _ in range(CALLS - 1)]
    else:
        rest = [first] * (CALLS - 1)
    name = f"n{len(b.sizes)}"
    b.sizes[name] = [first] + rest
    return name


def _numel_ok(b: _Builder, dims) -> bool:
    return all(math.prod(b.sizes[d][k] if isinstance(d, str) else d for d in dims) <= MAX_NUMEL
               for k in range(CALLS))


def _draw_dims(b: _Builder) -> tuple:
    for _ in range(20):
        dims = []
        for _ in range(b.r.choice([1, 2, 2, 3, 3])):
            if b.r.random() < 0.12:
                dims.append(1)
            elif b.sizes and b.r.random() < 0.45:
                dims.append(b.r.choice(sorted(b.sizes)))
            else:
                dims.append(_new_symbol(b))
        if _numel_ok(b, dims):
            return tuple(dims)
    return (1,)


def _partner(b: _Builder, dims) -> tuple:
    s = [1 if b.r.random() < 0.3 else d for d in dims]
    drop = b.r.randint(0, len(s) - 1) if s and b.r.random() < 0.3 else 0
    return tuple(s[drop:])


def _input(b: _Builder, dims=None, dtype=None) -> str:
    name = f"x{len(b.inputs)}"
    dims = _draw_dims(b) if dims is None else dims
    if dtype is None:
        dtype = F32 if b.grad or b.r.random() < 0.5 else b.r.choice(FZ.DTYPES)
    layout = "transposed" if len(dims) >= 2 and b.r.random() < 0.2 else "contiguous"
    b.inputs.append((dims, dtype, layout))
    for k, env in enumerate(b.envs):
        shape = tuple(b.sizes[d][k] if isinstance(d, str) else d for d in dims)
        env[name] = FZ._fill(shape, dtype, b.gens[k], layout).requires_grad_(
            b.grad and dtype.is_floating_point)
    return name


def _float_arg(b: _Builder) -> str:
    if b.floats and (len(b.floats) >= 2 or b.r.random() < 0.5):
        return f"s{b.r.randrange(len(b.floats))}"
    # under mark_dynamic (dynamic=None) Dynamo specialises a float argument, and a new value
    # recompiles (automatic dynamic): there its value stays
    values = [b.r.choice(FLOATS) for _ in range(CALLS)]
    b.floats.append([values[0]] * CALLS if b.mark else values)
    name = f"s{len(b.floats) - 1}"
    for k, floats in enumerate(b.float_envs):
        floats[name] = b.floats[-1][k]
    return name


# ---- the dynamic ops -------------------------------------------------------------------------

def _axis(b: _Builder, t) -> int:
    return b.r.choice([-1, -1, b.r.randrange(t.dim())])


def _gen_sym_slice(b: _Builder) -> bool:
    """A slice with bounds computed from the axis' size (or negative / open ones)."""
    x = b.pick(lambda u: u.dim() >= 1)
    if x is None:
        return False
    t = b.env[x]
    d = _axis(b, t) % t.dim()
    n = f"{x}.shape[{d if b.r.random() < 0.6 else d - t.dim()}]"
    bounds = b.r.choice([f":{n} - 1", "1:", f"-{b.r.randint(1, 3)}:", f"{n} // 2:",
                         f":{n} // 2", f"1 - {n}:", f"2:{n} + 3", f"{n} - 2:{n}", "1:-1",
                         f":-({n} // 3)", f"{n}:", f"-{n}:{n} - 1", "::2", f"1:{n}:2"])
    pre = "..., " if d == t.dim() - 1 and b.r.random() < 0.5 else ":, " * d
    out = b.fresh()
    call = f"{x}[{pre}{bounds}]"
    owned = b.r.random() < 0.5                      # read by a pointwise op in the region
    if owned:
        if b.r.random() < 0.5:
            op = b.r.choice(FZ.UNARY)
            call = f"({call} * 2)" if FZ.singular_near_zero(b, op, t) else f"{op}({call})"
        else:
            call = f"({call} * 2)"
    return b.try_line(f"{out} = {call}", out, owned)


def _gen_arange(b: _Builder) -> bool:
    """torch.arange of a size in a mask, a compare, or arithmetic with the value."""
    x = b.pick(lambda u: u.dim() >= 1)
    if x is None:
        return False
    t = b.env[x]
    n = f"{x}.shape[-1]"
    fill = b.r.choice(["0.0", "-1.5", "float('-inf')" if t.is_floating_point() else "-3"])
    forms = [f"torch.where(torch.arange({n}) < {n} // 2, {x}, {fill})",
             f"{x} + torch.arange({n})",
             f"{x} * (torch.arange({n}) % 2 == 0)",
             f"{x}.masked_fill(torch.arange({n}) >= {n} - 1, {fill})",
             f"torch.arange(1, {n} + 1) * {x}",
             f"{x} - torch.arange({n}, 0, -1)",
             f"{x} * (torch.arange({n}) / {n})",
             f"{x}[..., ::2] + torch.arange(0, {n}, 2)",
             f"(torch.arange({n}) == {x}.shape[-1] - 2) | ({x} > 0)"]
    if t.dim() >= 2:
        m = f"{x}.shape[-2]"
        forms += [f"torch.where(torch.arange({m})[:, None] >= torch.arange({n}), {x}, {fill})",
                  f"{x} + torch.arange({m})[:, None] * {n}"]
    out = b.fresh()
    return b.try_line(f"{out} = {b.r.choice(forms)}", out, True)


def _gen_float(b: _Builder) -> bool:
    """A Python float multiplied in: a literal, a function of a size, or a float argument."""
    x = b.pick()
    out = b.fresh()
    n = f"{x}.shape[-1]" if b.env[x].dim() else "2"
    s = _float_arg(b) if b.r.random() < 0.5 else None
    forms = [f"{x} * 0.5", f"{x} / math.sqrt({n})", f"{x} * {n} ** -0.5",
             f"{x} / ({n} + 1)", f"{x} * (1.0 / {n})", f"{x} - {n}"]
    if s is not None:
        forms = [f"{x} * {s}", f"{x} + {s}", f"{s} * {x} - 1.0", f"{x} / {s}",
                 f"{x} * ({s} * {n})"]
        # not `torch.where(x > s, x, s)`: Dynamo specialises s there (a recompile per value)
    return b.try_line(f"{out} = {b.r.choice(forms)}", out, True)


def _gen_sym_expand(b: _Builder) -> bool:
    """An expand of size-1 or new axes to another value's (symbolic) sizes."""
    x = b.pick()
    t = b.env[x]
    y = b.pick(lambda u: u.dim() >= 1)
    out = b.fresh()
    ty = b.env[y]
    j = b.r.randrange(ty.dim())
    size = f"{y}.shape[{j}]"
    if 1 in t.shape and b.r.random() < 0.6:
        sizes = [size if d == 1 and b.r.random() < 0.7 else "-1" for d in t.shape]
        line = f"{out} = {x}.expand({', '.join(sizes)})"
    elif b.r.random() < 0.5:
        line = f"{out} = {x}.unsqueeze(0).expand({size}, *{x}.shape)"
    else:
        line = f"{out} = {x}.expand_as({y})"
    if b.r.random() < 0.4:
        line += b.r.choice([" * 2", ".contiguous()", ".sum(0)"])
    return b.try_line(line, out, False)


def _gen_sym_norm(b: _Builder) -> bool:
    """softmax / log_softmax / layer_norm / an RMS norm / mean as sum over a size, along
    symbolic axes."""
    x = b.pick(lambda u: u.dim() >= 1 and u.is_floating_point())
    if x is None:
        return False
    t = b.env[x]
    out = b.fresh()
    d = _axis(b, t)
    k = b.r.randint(1, min(2, t.dim()))
    norm = f"{x}.shape[-{k}:]"
    w = b.pick_all(lambda n, e: e[n].dtype == t.dtype and
                   tuple(e[n].shape) == tuple(e[x].shape[-1:]))
    forms = [f"torch.softmax({x}, {d})", f"torch.log_softmax({x}, {d})",
             f"torch.softmax({x} / math.sqrt({x}.shape[-1]), -1)",
             f"F.layer_norm({x}, {norm}, eps=1e-3)",
             f"{x} * torch.rsqrt({x}.pow(2).mean({d}, keepdim=True) + 1e-6)",
             f"{x}.sum({d}) / {x}.shape[{d}]",
             f"{x} - {x}.amax({d}, keepdim=True)",
             f"{x}.mean({d}, keepdim=True)", f"torch.var({x}, {d})"]
    if w is not None and t.shape[-1] > 1:
        forms.append(f"F.layer_norm({x}, {x}.shape[-1:], {w}, {w})")
    line = f"{out} = {b.r.choice(forms)}"
    if "layer_norm" in line and all(math.prod(e[x].shape[-k:]) < 2 for e in b.envs):
        return False            # one element: eager's half-precision ~1e-7, pyfuser's 0
    return b.try_line(line, out, True)


def _gen_sym_view(b: _Builder) -> bool:
    """reshape / flatten / view written with sizes."""
    x = b.pick(lambda u: u.dim() >= 1)
    if x is None:
        return False
    t = b.env[x]
    out = b.fresh()
    forms = [f"{x}.reshape(-1)", f"{x}.flatten()",
             f"{x}.reshape(*{x}.shape[:-1], 1, {x}.shape[-1])"]
    if t.dim() >= 2:
        forms += [f"{x}.reshape({x}.shape[0], -1)", f"{x}.flatten(0, 1)",
                  f"{x}.reshape(-1, {x}.shape[-1])", f"{x}.view({x}.shape[0] * {x}.shape[1], "
                  f"*{x}.shape[2:])", f"{x}.transpose(0, 1).reshape({x}.shape[1], -1)"]
    if t.dim() >= 3:
        forms.append(f"{x}.reshape({x}.shape[0], {x}.shape[1] * {x}.shape[2])")
    return b.try_line(f"{out} = {b.r.choice(forms)}", out, False)


def _gen_roundtrip(b: _Builder) -> bool:
    """A cast to bfloat16 or half and back (sometimes an op between)."""
    x = b.pick(lambda u: u.is_floating_point())
    if x is None:
        return False
    low = b.r.choice(["torch.bfloat16", "torch.float16"])
    back = DTYPE_NAME[b.env[x].dtype]
    mid = b.r.choice(["", " * 2", ".exp()", ".sum(-1, keepdim=True)"]) if b.env[x].dim() else ""
    out = b.fresh()
    return b.try_line(f"{out} = ({x}.to({low}){mid}).to({back})", out, True)


def _dims_of(b: _Builder, x: str) -> tuple:
    """Value x's axes as symbols: the symbol whose sizes the axis has at every call (first
    sizes are distinct, so at most one), a fixed size no symbol starts with as a new fixed
    symbol, else 1 (a computed size, `n - 1`: broadcast)."""
    dims = []
    for i in range(b.env[x].dim()):
        sizes = [env[x].shape[i] for env in b.envs]
        sym = next((s for s, v in b.sizes.items() if v == sizes), None)
        if sym is None and len(set(sizes)) == 1 and sizes[0] >= 2 and \
                sizes[0] not in {v[0] for v in b.sizes.values()}:
            sym = f"n{len(b.sizes)}"
            b.sizes[sym] = sizes
        dims.append(sym if sym is not None else 1)
    return tuple(dims)


def _gen_new_input_binary(b: _Builder) -> bool:
    return FZ.binary_with_new_input(b, lambda x: _input(
        b, dims=_partner(b, _dims_of(b, x)), dtype=FZ.same_dtype_often(b, x)))


GENERATORS = [(FZ._gen_binary, 14), (FZ._gen_unary, 9), (_gen_new_input_binary, 8),
              (FZ._gen_cast, 4), (FZ._gen_where_clamp, 5), (FZ._gen_reduction, 7),
              (FZ._gen_view, 6), (FZ._gen_resize, 5), (FZ._gen_inplace, 4),
              (_gen_sym_slice, 12), (_gen_arange, 8), (_gen_float, 9), (_gen_sym_expand, 6),
              (_gen_sym_norm, 10), (_gen_sym_view, 7), (_gen_roundtrip, 5)]


def generate(seed: int, more_ops: bool = False) -> DynProgram:
    """Program `seed`; `more_ops`: with 1-4 more lines of fx_fuzz_more's ops as extra outputs
    (a stream of their own: the program is otherwise the seed's usual one)."""
    r = random.Random(seed)
    grad = r.random() < 0.17
    b = _Builder(seed, grad)
    b.r = r
    b.mark = r.random() < 0.25
    b.inputs = []
    b.gens = [torch.Generator().manual_seed(seed * CALLS + k) for k in range(CALLS)]
    for i in range(r.randint(1, 2)):
        _input(b, dtype=F32 if grad and i == 0 else None)
    produced = FZ.draw_ops(b, GENERATORS, r.randint(2, 10), 300, "x0")
    outs = [produced[-1]] + [n for n in produced[:-1] if r.random() < 0.35]
    if more_ops:
        from fx_fuzz_more import extra_ops
        outs += extra_ops(b, seed)
    # a float argument only dead code reads is specialised by Dynamo (a recompile per value):
    # the values computed with one are returned
    floated = [line.split(" = ")[0] for line in b.lines if re.search(r"\bs\d", line)]
    outs += [n for n in floated if n in produced and n not in outs]
    params = [f"x{i}" for i in range(len(b.inputs))] + [f"s{i}" for i in range(len(b.floats))]
    source, loosest = FZ.program_source(b, params, outs)
    if "torch.bfloat16" in source or "torch.float16" in source:
        loosest = max([loosest, BF16 if "bfloat16" in source else F16],
                      key=lambda d: TOLERANCE[d])
    # from a stream of its own: the programs are those the campaigns before it ran
    replay = random.Random(seed * 7919 + 31).random() < 0.3
    return DynProgram(seed, source, b.inputs, b.sizes, b.floats, grad,
                      mark=b.mark, loosest=loosest, replay=replay)
