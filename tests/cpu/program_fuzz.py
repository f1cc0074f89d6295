"""Differential fuzzing of the graph fuser: random TorchScript programs, fused vs eager.

`generate(seed) -> Program` builds a random program of 1-7 ops over 1-3 inputs: pointwise ops
of every arity (with tensor, 0-dim tensor and Python-scalar operands, alpha and rounding
modes), casts, comparisons and `where`, views / reshapes / permutes / transposes / squeezes /
unsqueezes / expands / flattens, reductions, cats and stacks of 2-3 tensors, and in-place ops
(on inputs and intermediates),
over dtypes float32/16, bfloat16, float64, int8/32/64, uint8 and bool, shapes of rank 0-3 with
size-1 and size-0 axes, broadcasting operands, and inputs that are contiguous, transposed,
sliced (strided), expanded (stride 0) or offset in their storage, a few requiring grad; view
and expand sizes also read at run time (`aten::size`). Each op is run eagerly while
the program is built (a choice eager rejects is drawn again), so programs are valid and their
dtypes and shapes known. A program is IR text (`Program.text`, parsed by pyfuser's parser)
plus the recipe of its inputs (`Program.make_inputs(device)`).

The op generators (one random op each, appended to a program being built) are in
program_ops.py; checking (`check`, `compare`, `shrink`, `describe`, `run_many`, and the GPU's
`pow` rule the reference follows) is in program_check.py, reached through this module too.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Optional

import torch

from pyfuser.frontend.torchscript.ops import call_op

F32, F16, BF16, F64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
I8, I32, I64, U8, BOOL = torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool
DTYPES = [F32, F32, F32, F32, F16, BF16, F64, I32, I64, I64, I8, U8, BOOL]
_CODE = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
         torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bool: 11, torch.bfloat16: 15}
LAYOUTS = ["contiguous"] * 6 + ["transposed", "transposed", "sliced", "expanded", "offset"]

UNARY = ["abs", "neg", "exp", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
         "relu", "silu", "mish", "hardswish", "hardsigmoid", "reciprocal", "floor", "ceil",
         "round", "trunc", "frac", "sign", "erf", "expm1", "log1p", "isnan", "isinf",
         "isfinite", "logical_not", "bitwise_not", "relu6", "exp2", "sinh", "atan", "erfc"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le",
          "gt", "ge", "remainder", "fmod", "atan2", "logical_and", "logical_or", "logical_xor",
          "bitwise_and", "bitwise_or", "bitwise_xor", "rsub"]
INPLACE = ["add_", "mul_", "sub_", "relu_", "neg_", "clamp_", "sigmoid_", "div_"]
TOLERANCE = {F64: (1e-9, 1e-12), F32: (1e-5, 1e-6), F16: (2e-3, 1e-3), BF16: (1.6e-2, 1e-2)}


@dataclass
class InputSpec:
    name: str
    kind: str                       # "tensor", "int", "float"
    dtype: Optional[torch.dtype] = None
    shape: tuple = ()
    layout: str = "contiguous"
    seed: int = 0
    value: object = None            # scalars
    requires_grad: bool = False

    def make(self, device):
        t = self._make(device)
        return t.requires_grad_() if self.requires_grad else t

    def _make(self, device):
        if self.kind != "tensor":
            return self.value
        g = torch.Generator().manual_seed(self.seed)
        shape, layout = list(self.shape), self.layout
        if layout == "transposed" and len(shape) >= 2:
            base = _fill(shape[::-1], self.dtype, g).to(device)
            return base.permute(*reversed(range(len(shape))))
        if layout == "sliced" and shape:
            big = shape[:-1] + [shape[-1] * 2]
            return _fill(big, self.dtype, g).to(device)[..., ::2]
        if layout == "expanded" and 1 in shape:
            return _fill(shape, self.dtype, g).to(device).expand(
                *[3 if s == 1 and i == shape.index(1) else s for i, s in enumerate(shape)])
        if layout == "offset":
            n = math.prod(shape)
            return _fill([n + 3], self.dtype, g).to(device)[3:].view(shape)
        return _fill(shape, self.dtype, g).to(device)

    def real_shape(self):
        if self.kind == "tensor" and self.layout == "expanded" and 1 in self.shape:
            i = self.shape.index(1)
            return tuple(3 if j == i else s for j, s in enumerate(self.shape))
        return tuple(self.shape)

    def ir_type(self) -> str:
        return {"tensor": "Tensor", "int": "int", "float": "float"}[self.kind]


def _fill(shape, dtype, g):
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g) * 2
        t.view(-1)[::7] = t.view(-1)[::7].round()        # some integral values (pow, round)
        return t.to(dtype)
    if dtype == BOOL:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo = 0 if dtype == U8 else -9
    t = torch.randint(lo, 10, shape, generator=g)
    return torch.where(t == 0, torch.ones_like(t), t).to(dtype)     # no zero divisors


@dataclass
class OpRecord:
    out: str                         # IR value name of the result
    kind: str
    args: list                       # IR value names
    line: str                        # the IR lines (constants first) of this op
    uses: list = field(default_factory=list)   # tensor values it reads


@dataclass
class Program:
    seed: int
    inputs: list
    ops: list
    outputs: list

    @property
    def text(self) -> str:
        params = ",\n      ".join(f"%{i.name} : {i.ir_type()}" for i in self.inputs)
        body = "".join(op.line for op in self.ops)
        return f"graph({params}):\n{body}  return ({', '.join('%' + o for o in self.outputs)})\n"

    def make_inputs(self, device="cpu") -> list:
        return [i.make(device) for i in self.inputs]


@dataclass
class Failure:
    mode: str
    what: str

    def __str__(self):
        return f"[{self.mode}] {self.what}"


# ----- generation -----------------------------------------------------------------------------
class _Builder:
    def __init__(self, seed: int):
        self.r = random.Random(seed)
        self.seed = seed
        self.n = 0
        self.values: dict = {}       # name -> example value (tensor or scalar)
        self.tensors: list = []      # names of tensor values, in order
        self.ops: list = []
        self.lines: list = []

    def fresh(self, stem="v") -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def const(self, value) -> str:
        name = self.fresh("c")
        if value is None:
            self.lines.append(f"  %{name} : NoneType = prim::Constant()\n")
        elif isinstance(value, bool):
            self.lines.append(f"  %{name} : bool = prim::Constant[value={int(value)}]()\n")
        elif isinstance(value, int):
            self.lines.append(f"  %{name} : int = prim::Constant[value={value}]()\n")
        elif isinstance(value, float):
            self.lines.append(f"  %{name} : float = prim::Constant[value={value!r}]()\n")
        elif isinstance(value, str):
            self.lines.append(f"  %{name} : str = prim::Constant[value=\"{value}\"]()\n")
        elif isinstance(value, list):
            if self.r.random() < 0.5:
                items = [self.const(v) for v in value]
                self.lines.append(f"  %{name} : int[] = prim::ListConstruct("
                                  f"{', '.join('%' + i for i in items)})\n")
            else:
                self.lines.append(f"  %{name} : int[] = prim::Constant[value="
                                  f"[{', '.join(str(v) for v in value)}]]()\n")
        else:
            raise TypeError(value)
        self.values[name] = value
        return name

    def pick(self, pred=lambda t: True, recent: bool = True):
        names = [n for n in self.tensors if pred(self.values[n])]
        if not names:
            return None
        if recent and self.r.random() < 0.6:
            return names[-1]
        return self.r.choice(names)

    def emit(self, kind: str, args: list, out_is_tensor=True) -> Optional[str]:
        """Run `kind` eagerly on the example values; on success record the op."""
        vals = [self.values[a] for a in args]
        try:
            res = call_op(kind, vals, lambda d: d)
        except Exception:      # noqa: BLE001 - eager rejects this choice: draw again
            return None
        if len(res) != 1 or not isinstance(res[0], torch.Tensor):
            return None
        out = self.fresh()
        self.values[out] = res[0]
        consts = "".join(self.lines)
        self.lines = []
        line = consts + f"  %{out} : Tensor = {kind}({', '.join('%' + a for a in args)})\n"
        self.ops.append(OpRecord(out, kind, list(args), line,
                                 [a for a in args if isinstance(self.values[a], torch.Tensor)]))
        self.tensors.append(out)
        return out


def _shape(r: random.Random, rank=None) -> tuple:
    rank = r.choice([0, 1, 1, 2, 2, 2, 3, 3]) if rank is None else rank
    sizes = [0] + [1] * 4 + [2, 3, 4, 5, 6, 7, 8]
    shape = [r.choice(sizes[1:]) if r.random() > 0.04 else 0 for _ in range(rank)]
    return tuple(shape)


def _broadcast_partner(r: random.Random, shape: tuple) -> tuple:
    if not shape or r.random() < 0.5:
        return shape if r.random() < 0.8 else ()
    drop = r.randint(0, len(shape))
    tail = list(shape[drop:])
    return tuple(1 if r.random() < 0.3 else s for s in tail)


def _make_inputs(b: _Builder) -> list:
    r = b.r
    n = r.choice([1, 2, 2, 2, 3])
    base = _shape(r)
    specs = []
    for i in range(n):
        dtype = r.choice(DTYPES)
        shape = base if i == 0 else _broadcast_partner(r, base)
        layout = r.choice(LAYOUTS) if shape and 0 not in shape else "contiguous"
        if layout == "transposed" and len(shape) < 2:
            layout = "contiguous"
        if layout == "expanded" and 1 not in shape:
            layout = "contiguous"
        grad = dtype.is_floating_point and layout == "contiguous" and r.random() < 0.06
        specs.append(InputSpec(f"x{i}", "tensor", dtype, shape, layout, b.seed * 7 + i,
                               requires_grad=grad))
    if r.random() < 0.2:
        kind = r.choice(["int", "float"])
        specs.append(InputSpec(f"s{n}", kind, value=r.choice([2, 3, -1]) if kind == "int"
                               else r.choice([0.5, 1.5, -2.25])))
    for s in specs:
        b.values[s.name] = s.make("cpu")
        if s.kind == "tensor":
            b.tensors.append(s.name)
    return specs


def generate(seed: int) -> Program:
    from program_ops import GENERATORS          # the op generators import this module's names
    b = _Builder(seed)
    specs = _make_inputs(b)
    want = b.r.randint(1, 7)
    gens, weights = zip(*GENERATORS)
    tries = 0
    while len(b.ops) < want and tries < want * 12:
        tries += 1
        b.lines = []
        b.r.choices(gens, weights)[0](b)
    b.lines = []
    candidates = [op.out for op in b.ops] or [s.name for s in specs if s.kind == "tensor"]
    outs = [candidates[-1]]
    for name in candidates[:-1]:
        if b.r.random() < 0.25:
            outs.append(name)
    if b.r.random() < 0.05:
        outs.append(specs[0].name)
    return Program(seed, specs, b.ops, outs)


# the checking half (check, compare, shrink, describe, run_many, ...) lives in program_check.py,
# which imports the generator's names above: reached through this module lazily (no cycle)
_CHECKING = frozenset(("check", "compare", "shrink", "describe", "run_many",
                       "loosest_input_dtype"))


def __getattr__(name):
    if name in _CHECKING:
        import program_check
        return getattr(program_check, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
