"""The pieces of an FX fuzz program (fx_fuzz.py draws the ops, fx_fuzz_dynamic.py its
dynamic-shape variant): the dtypes and tolerances, the `Program` record (source text and input
specs, run as a Python function), `_Builder` (lines run eagerly as they are drawn), shape and
scalar draws, the weighted draw of ops (`draw_ops`) and the function's source
(`program_source`)."""
from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
I32, I64, BOOL = torch.int32, torch.int64, torch.bool
DTYPES = [F32, F32, F32, F16, BF16, I32, I64, BOOL]
FLOATS = (F32, F16, BF16)
DTYPE_NAME = {F32: "torch.float32", F16: "torch.float16", BF16: "torch.bfloat16",
              I32: "torch.int32", I64: "torch.int64", BOOL: "torch.bool"}
# (rtol, atol): pyfuser computes half/bfloat16 chains in float32 and rounds once, eager after
# every op, so a few ops' roundings apart is tolerated
TOLERANCE = {F32: (1e-4, 1e-5), F16: (1e-2, 1e-2), BF16: (5e-2, 5e-2),
             torch.float64: (1e-7, 1e-9)}

UNARY = ["torch.neg", "torch.abs", "torch.exp", "torch.sigmoid", "torch.tanh", "torch.relu",
         "torch.sin", "torch.sqrt", "torch.log", "torch.rsqrt", "torch.floor",
         "torch.logical_not", "F.gelu", "F.silu"]
BINARY = ["torch.add", "torch.sub", "torch.mul", "torch.div", "torch.maximum", "torch.minimum",
          "torch.gt", "torch.lt", "torch.eq", "torch.ne", "torch.pow"]
SCALAR_BINARY = ["torch.add", "torch.sub", "torch.mul", "torch.div", "torch.gt", "torch.pow"]
INPLACE = ["add_", "mul_", "clamp_", "relu_", "neg_"]


class _FormulaGelu:
    """torch.nn.functional with `gelu(x)` (approximate="none") computed by the op table's
    formula; everything else is F's."""

    def __getattr__(self, name):
        return getattr(F, name)

    @staticmethod
    def gelu(x, approximate="none"):
        from pyfuser.ir.ops import _gelu
        return _gelu(x) if approximate == "none" else F.gelu(x, approximate=approximate)


@dataclass
class Program:
    seed: int
    source: str
    inputs: list  # (shape, dtype) per input
    grad: bool = False
    input_seed: int = 0
    stats: dict = field(default_factory=dict)
    # the least precise float dtype any value of the program has: a float32 output computed
    # through bfloat16 values is held to bfloat16's tolerance
    loosest: torch.dtype = F32

    def make_inputs(self) -> list:
        g = torch.Generator().manual_seed(self.input_seed)
        out = []
        for shape, dtype, *layout in self.inputs:
            out.append(_fill(shape, dtype, g, *layout)
                       .requires_grad_(self.grad and dtype.is_floating_point))
        return out

    def function(self, gelu_formula: bool = False, float64: bool = False):
        """The program as a Python function; `gelu_formula`: its `F.gelu` (exact form) is the op
        table's formula (ir/ops.py `_gelu`), not CPU eager's, which gives NaN for +inf on its
        vectorized path and inf otherwise (fx_check's judge of a mismatch); `float64`: its
        casts and `dtype=` to a float dtype are to float64 (fx_check's float64 rerun)."""
        ns = {"torch": torch, "F": _FormulaGelu() if gelu_formula else F}
        source = self.source
        if float64:
            for d in FLOATS:
                source = source.replace(DTYPE_NAME[d], "torch.float64")
        exec(compile(source, f"<fx_fuzz {self.seed}>", "exec"), ns)
        return ns["f"]

    def describe(self) -> str:
        ins = ", ".join(f"x{i}: {tuple(s)} {DTYPE_NAME[d]} {' '.join(lay)}"
                        for i, (s, d, *lay) in enumerate(self.inputs))
        return f"seed {self.seed}{' (grad)' if self.grad else ''}; inputs {ins}\n{self.source}"


def _fill(shape, dtype, g, layout="contiguous") -> torch.Tensor:
    if layout == "transposed":  # the last two axes' strides swapped
        return _fill(tuple(shape[:-2]) + (shape[-1], shape[-2]), dtype, g).transpose(-1, -2)
    if dtype == BOOL:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-6, 7, shape, generator=g).to(dtype)
    return (torch.randn(shape, generator=g) * 2).to(dtype)


class _Builder:
    def __init__(self, seed: int, grad: bool):
        self.r = random.Random(seed)
        self.grad = grad
        self.lines: list[str] = []
        self.env: dict = {}          # name -> eager value
        self.owned: set = set()      # names an op produced fresh (no view of anything)
        self.count = 0
        self.ns = {"torch": torch, "F": F}
        self.loosest = F32

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def pick(self, pred=lambda t: True) -> Optional[str]:
        names = [n for n, t in self.env.items() if pred(t)]
        if not names:
            return None
        # favour recent values so programs are chains more than fans
        return names[-1] if self.r.random() < 0.5 else self.r.choice(names)

    def try_line(self, line: str, out: Optional[str], owned: bool) -> bool:
        scope = dict(self.env)
        try:
            with torch.set_grad_enabled(self.grad), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # var() with no degrees of freedom: NaN, fine
                exec(line, self.ns, scope)
        except Exception:
            return False
        if out is not None:
            v = scope[out]
            if not isinstance(v, torch.Tensor) or v.numel() > 4096:
                return False
            self.env[out] = v
        return self.keep(line, out, owned)

    def keep(self, line: str, out: Optional[str], owned: bool) -> bool:
        """Record a line that ran (its output already in the environment): the loosest
        tolerance so far, whether the program owns the output, the line."""
        if out is not None:
            v = self.env[out]
            if TOLERANCE.get(v.dtype, (0, 0)) > TOLERANCE[self.loosest]:
                self.loosest = v.dtype
            if owned:
                self.owned.add(out)
        self.lines.append(line)
        return True


def _shape(r: random.Random) -> tuple:
    rank = r.choice([0, 1, 2, 2, 3, 3])
    while True:
        shape = tuple(r.choice([1, 2, 3, 4, 5, 6, 7, 16, 33]) for _ in range(rank))
        if _numel(shape) <= 2048:
            return shape


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _broadcast_partner(r: random.Random, shape: tuple) -> tuple:
    s = [1 if r.random() < 0.3 else d for d in shape]
    drop = r.randint(0, len(s) - 1) if r.random() < 0.3 else 0
    return tuple(s[drop:])


def _scalar(r: random.Random, t: torch.Tensor) -> str:
    if t.dtype.is_floating_point or r.random() < 0.3:
        return repr(r.choice([0.5, -1.5, 2.0, 3.0, 1e-3]))
    return repr(r.choice([1, 2, -3, 0]))


def draw_ops(b: _Builder, generators, n_ops: int, tries: int, fallback: str) -> list:
    """Draw ops from the weighted `generators` until `n_ops` of them made a line (at most
    `tries` draws); the values made, in order (`v = fallback * 2` if none was)."""
    gens, weights = zip(*generators)
    done = drawn = 0
    while done < n_ops and drawn < tries:
        drawn += 1
        if b.r.choices(gens, weights)[0](b):
            done += 1
    produced = [n for n in b.env if n.startswith("v")]
    if not produced:
        out = b.fresh()
        b.lines.append(f"{out} = {fallback} * 2")
        produced = [out]
    return produced


def program_source(b: _Builder, params: list, outs: list) -> tuple:
    """(source of `def f(params)` returning `outs`, the loosest tolerance's dtype: the
    builder's and its inputs')."""
    body = "".join(f"    {line}\n" for line in b.lines)
    source = f"def f({', '.join(params)}):\n{body}    return ({', '.join(outs)},)\n"
    loosest = max([b.loosest] + [d for _, d, _ in b.inputs if d in TOLERANCE],
                  key=lambda d: TOLERANCE[d])
    return source, loosest
