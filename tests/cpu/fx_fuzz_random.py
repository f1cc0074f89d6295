"""Random ops for the torch.compile backend's fuzzer (fx_fuzz.py's sibling): programs holding
`F.dropout`, `torch.rand_like`, `bernoulli` (of a probability or of a tensor of them),
`uniform_` and `torch.rand`, among fx_fuzz's deterministic lines, before and after them.

A kernel's random numbers are not eager's (another generator: docs/compile_backend.md), so no
output is compared with eager's draw. `check(program)` judges instead:
- each random value's law: dtype and shape as eager's, `rand_like` / `rand` in [0, 1),
  `uniform_(lo, hi)` in [lo, hi], bernoulli values 0 or 1, dropout values 0 or the input times
  1 / (1 - p); the keep (or one) rate and the mean within 6 standard deviations (plus 2 / n) of
  theirs where a value has 32 elements or more;
- everything else exactly as eager computes it from those draws: a *replay* of the program runs
  eagerly with every random line replaced by the compiled call's value (a dropout by
  `v * mask * scale`, its mask read from the compiled output: nonzero, or NaN of a finite
  input), so the outputs after a random op, and a dropout's own output, must equal the replay's
  within fx_fuzz's tolerances; in grad mode the backward must give the replay's gradients (the
  backward's mask is the forward's). Where a dropout's input holds a 0 or a NaN in the replay
  the mask is not readable there and the gradients are not compared (counted);
- reproducibility: the same outputs bit for bit after `torch.manual_seed(s)` twice, other
  numbers on the call after (a value whose chance of repeating is below 1e-9), and the draws of
  one call independent: every pair of random values of one call, and each value and its next
  call's, of equal numel n >= 256, have a joint rate of their indicators (kept, one, below
  0.5) within 6 standard deviations of the product of their rates (a counter reused by two
  launches or two ops gives the rate itself).

`generate(seed)`: program `seed`, from `random.Random(seed)` alone. `dump(p, path)` writes
the reproducible call's outputs (tools: compare two pyfuser versions bit for bit).
"""
from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from fx_fuzz import GENERATORS, _gen_input
from fx_fuzz_base import (BF16, DTYPE_NAME, F16, F32, FLOATS, Program, _Builder, draw_ops,
                          program_source)

SIGMAS = 6.0
PROBS = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]
# the deterministic lines drawn after a random value: fx_fuzz's, but no in-place op (a
# program's in-place ops on a random value are drawn as such, below)
AFTER = [(g, w) for g, w in GENERATORS if g.__name__ != "_gen_inplace"]


@dataclass
class RandomLine:
    name: str        # the value the line makes
    kind: str        # dropout / rand_like / bernoulli_p / bernoulli_t / uniform / rand
    arg: str = ""    # the value it reads ("" for rand)
    p: float = 0.0   # dropout's p, bernoulli's probability
    lo: float = 0.0
    hi: float = 1.0


@dataclass
class RandProgram(Program):
    randoms: list = field(default_factory=list)   # RandomLine per random line, in order
    n_outs: int = 0                                # outputs before the random values


def _float_value(b: _Builder) -> Optional[str]:
    return b.pick(lambda t: t.dtype in FLOATS and t.numel() <= 2048)


def _gen_random(b: _Builder) -> bool:
    kind = b.r.choice(["dropout", "dropout", "dropout", "rand_like", "bernoulli_p",
                       "bernoulli_t", "uniform", "rand", "dropout_eval"])
    out = b.fresh()
    if kind in ("dropout", "dropout_eval"):
        x = _float_value(b)
        if x is None:
            return False
        p = b.r.choice(PROBS)
        if kind == "dropout_eval":      # deterministic: a copy, compared as any line is
            return b.try_line(f"{out} = F.dropout({x}, p={p}, training=False)", out, True)
        line = RandomLine(out, "dropout", x, p)
        src = f"{out} = F.dropout({x}, p={p}, training=True)"
    elif kind == "rand_like":
        x = b.pick(lambda t: t.numel() <= 2048)
        if x is None:
            return False
        dt = b.r.choice([None, None, F32, F16, BF16])
        if dt is None and b.env[x].dtype not in FLOATS:
            dt = F32
        line = RandomLine(out, "rand_like", x)
        src = f"{out} = torch.rand_like({x}" + (f", dtype={DTYPE_NAME[dt]})" if dt else ")")
    elif kind == "bernoulli_p":
        x = b.pick(lambda t: t.numel() <= 2048)
        if x is None:
            return False
        p = b.r.choice(PROBS)
        line = RandomLine(out, "bernoulli_p", x, p)
        src = f"{out} = torch.empty_like({x}).bernoulli_({p})"
    elif kind == "bernoulli_t":      # the probabilities a sigmoid (or a clamp) of a value
        x = _float_value(b)
        if x is None:
            return False
        probs = b.r.choice([f"torch.sigmoid({x})", f"{x}.clamp(0, 1)"])
        line = RandomLine(out, "bernoulli_t", x)
        src = f"{out} = torch.bernoulli({probs})"
    elif kind == "uniform":
        x = _float_value(b)
        if x is None:
            return False
        lo, hi = b.r.choice([(0.0, 1.0), (-2.0, 3.0), (0.5, 0.75), (-1.0, -1.0)])
        line = RandomLine(out, "uniform", x, lo=lo, hi=hi)
        src = f"{out} = torch.empty_like({x}).uniform_({lo}, {hi})"
    else:
        shape = tuple(b.r.choice([1, 2, 3, 7, 16, 33]) for _ in range(b.r.randint(0, 3)))
        dt = b.r.choice([F32, F32, F16, BF16])
        line = RandomLine(out, "rand")
        src = f"{out} = torch.rand({shape}, dtype={DTYPE_NAME[dt]})"
    if not b.try_line(src, out, True):
        return False
    if b.grad and kind in ("rand_like", "bernoulli_p", "uniform", "rand", "bernoulli_t"):
        b.env[out] = b.env[out].detach()   # a fresh draw holds no gradient
    b.randoms.append(line)
    return True


def generate(seed: int) -> RandProgram:
    r = random.Random(seed)
    grad = r.random() < 0.3
    b = _Builder(seed, grad)
    b.r = r
    b.inputs = []
    b.randoms = []
    b.gen = torch.Generator().manual_seed(seed)
    for i in range(r.randint(1, 2)):
        _gen_input(b, dtype=r.choice([F32, F32, F16, BF16]) if i == 0 else None)
    produced = draw_ops(b, GENERATORS if not grad else AFTER, r.randint(0, 3), 60,
                        next(iter(b.env)))
    for _ in range(r.randint(1, 3)):
        for _ in range(10):
            if _gen_random(b):
                break
        draw_ops(b, AFTER, r.randint(0, 3), 40, next(iter(b.env)))
    produced = [n for n in b.env if n.startswith("v")]
    rand_names = [x.name for x in b.randoms]
    outs = [n for n in produced if n not in rand_names]
    outs = outs[-1:] + [n for n in outs[:-1] if r.random() < 0.3]
    source, loosest = program_source(b, [f"x{i}" for i in range(len(b.inputs))],
                                     outs + rand_names)
    return RandProgram(seed, source, b.inputs, grad, input_seed=seed, loosest=loosest,
                       randoms=list(b.randoms), n_outs=len(outs))


# ---- the replay ----------------------------------------------------------------------------------
def _dropout_mask(v: torch.Tensor, rec: torch.Tensor) -> torch.Tensor:
    """The kept elements of a compiled dropout of v: its output nonzero, or NaN where v is
    not (inf * 0)."""
    return (rec != 0) & ~(rec.isnan() & ~v.isnan())


def _ambiguous(v: torch.Tensor) -> bool:
    """v holds an element whose dropout output does not tell whether it was kept."""
    return bool(((v == 0) | v.isnan()).any())


def replay_source(p: RandProgram) -> str:
    """p's source with each random line replaced by `_R(k, v)`: the compiled call's value
    (dropout: v * mask * scale, the mask the compiled output's)."""
    lines = p.source.splitlines()
    by_name = {x.name: k for k, x in enumerate(p.randoms)}
    out = []
    for line in lines:
        name = line.strip().split(" = ", 1)[0]
        if " = " in line and name in by_name:
            k = by_name[name]
            arg = p.randoms[k].arg or "None"
            out.append(f"    {name} = _R({k}, {arg})")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _replay_fn(p: RandProgram, recorded: list, ambiguous: list):
    def R(k, v):
        line, rec = p.randoms[k], recorded[k].detach()
        if line.kind != "dropout":
            return rec.clone()
        if _ambiguous(v.detach()):
            ambiguous.append(k)
        m = _dropout_mask(v.detach(), rec)
        keep = 1.0 - line.p
        return v * m.to(v.dtype) * (1.0 / keep if keep else 0.0)
    ns = {"torch": torch, "F": F, "_R": R}
    exec(compile(replay_source(p), f"<fx_fuzz_random replay {p.seed}>", "exec"), ns)
    return ns["f"]


# ---- the checks ----------------------------------------------------------------------------------
@dataclass
class Failure:
    program: RandProgram
    what: str

    def __str__(self):
        return f"{self.what}\n{self.program.describe()}"


def _indicator(line: RandomLine, v: Optional[torch.Tensor], rec: torch.Tensor):
    """(the value's 0/1 indicator per element, its expected rate) or None (no law to test)."""
    rec = rec.detach()
    if line.kind == "dropout":
        if v is None or line.p in (0.0, 1.0):
            return None
        v = v.detach()
        known = ~((v == 0) | v.isnan())
        if not bool(known.all()):
            return None
        return _dropout_mask(v, rec).reshape(-1), 1.0 - line.p
    if line.kind == "bernoulli_p":
        if line.p in (0.0, 1.0):
            return None
        return (rec != 0).reshape(-1), line.p
    if line.kind in ("rand_like", "rand"):
        return (rec.float() < 0.5).reshape(-1), 0.5
    if line.kind == "uniform" and line.hi > line.lo:
        mid = (line.lo + line.hi) / 2
        return (rec.float() < mid).reshape(-1), 0.5
    return None


def _rate_ok(ind: torch.Tensor, q: float) -> Optional[str]:
    n = ind.numel()
    if n < 32:
        return None
    rate = ind.float().mean().item()
    if abs(rate - q) > SIGMAS * math.sqrt(q * (1 - q) / n) + 2.0 / n:
        return f"rate {rate:.4f} over {n} elements, expected {q}"
    return None


def _joint_ok(a, b) -> Optional[str]:
    (ia, qa), (ib, qb) = a, b
    n = ia.numel()
    if n < 256 or ib.numel() != n:
        return None
    ra, rb = ia.float().mean().item(), ib.float().mean().item()
    joint = (ia & ib).float().mean().item()
    want = ra * rb
    sd = math.sqrt(max(qa * qb * (1 - qa * qb), 1e-12) / n)
    if abs(joint - want) > SIGMAS * sd + 4.0 / n:
        return f"joint rate {joint:.4f} over {n} elements, independent draws give {want:.4f}"
    return None


def _law(line: RandomLine, rec: torch.Tensor, want: torch.Tensor) -> Optional[str]:
    """The value's dtype, shape and range against eager's draw `want` of the same line."""
    if rec.dtype != want.dtype or tuple(rec.shape) != tuple(want.shape):
        return f"dtype {rec.dtype} shape {tuple(rec.shape)}, eager {want.dtype} " \
               f"{tuple(want.shape)}"
    r = rec.detach().float()
    if line.kind in ("rand_like", "rand"):
        if r.numel() and not bool(((r >= 0) & (r < 1)).all()):
            return f"values outside [0, 1): {r.min().item()}..{r.max().item()}"
    elif line.kind == "uniform":
        if r.numel() and not bool(((r >= line.lo) & (r <= line.hi)).all()):
            return f"values outside [{line.lo}, {line.hi}]: {r.min().item()}..{r.max().item()}"
    elif line.kind.startswith("bernoulli"):
        if not bool(((r == 0) | (r == 1)).all()):
            return f"values other than 0 and 1: {r.unique()[:8].tolist()}"
    if line.kind in ("rand_like", "rand", "uniform") and r.numel() >= 32 and line.hi > line.lo:
        mean = (line.lo + line.hi) / 2
        sd = (line.hi - line.lo) / math.sqrt(12 * r.numel())
        if abs(r.mean().item() - mean) > SIGMAS * sd + (line.hi - line.lo) / r.numel():
            return f"mean {r.mean().item():.4f} over {r.numel()} elements, expected {mean}"
    return None


def _compare(tag, got, want, loosest, grad=False) -> Optional[str]:
    from fx_check import _compare as cmp
    return cmp(tag, got, want, loosest, grad)


def _call(fn, p: RandProgram, inputs):
    with torch.set_grad_enabled(p.grad), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*inputs)


def _grads(p: RandProgram, outs, inputs):
    parts = [o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad
             and o.dtype.is_floating_point]
    if not parts:
        return None
    sum(parts).backward()
    return [x.grad if isinstance(x, torch.Tensor) else None for x in inputs]


def check(p: RandProgram, backend=None) -> Optional[Failure]:
    """Compile p with the pyfuser backend and judge it (module docstring); None when it
    passes. p.stats gathers what the run tested (counts of random values, rates, ...)."""
    import pyfuser
    from pyfuser.frontend.fx import reset_compiled
    backend = backend or pyfuser.backend
    from pyfuser.frontend.fx.compile_graph import clear_cache
    fn = p.function()
    torch._dynamo.reset()
    reset_compiled()
    clear_cache()           # regions lowered for earlier programs: a seed's result is its own
    torch.manual_seed(p.seed)
    try:
        want = _call(fn, p, p.make_inputs())
    except Exception as e:  # noqa: BLE001
        return Failure(p, f"eager raised {type(e).__name__}: {e} (the generator's)")
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    calls = []
    for reseed in (True, True, False):
        if reseed:
            torch.manual_seed(p.seed + 1)
        ins = p.make_inputs()
        try:
            got = _call(compiled, p, ins)
        except Exception as e:  # noqa: BLE001
            import torch._dynamo.exc as exc
            if isinstance(e, exc.Unsupported) and not isinstance(e, exc.BackendCompilerFailed):
                return None
            return Failure(p, f"pyfuser raised {type(e).__name__}: {str(e)[:400]}")
        grads = None
        if p.grad:
            try:
                grads = _grads(p, got, ins)
            except Exception as e:  # noqa: BLE001
                return Failure(p, f"pyfuser's backward raised {type(e).__name__}: "
                                  f"{str(e)[:400]}")
        calls.append((ins, got, grads))
    from fx_check import _record
    _record(p)
    torch._dynamo.reset()
    p.stats["random_values"] = len(p.randoms)
    for k, line in enumerate(p.randoms):
        p.stats.setdefault("kinds", {}).setdefault(line.kind, 0)
        p.stats["kinds"][line.kind] += 1
    (ins1, got1, grads1), (ins2, got2, grads2), (ins3, got3, _) = calls
    # reproducible under manual_seed
    for i, (a, b) in enumerate(zip(got1, got2)):
        if not torch.equal(a.detach().nan_to_num(7.0), b.detach().nan_to_num(7.0)):
            return Failure(p, f"output {i}: two calls after torch.manual_seed({p.seed + 1}) "
                              f"differ")
    if p.grad and grads1 is not None:
        for i, (a, b) in enumerate(zip(grads1, grads2)):
            if a is not None and not torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)):
                return Failure(p, f"grad of x{i}: two calls after torch.manual_seed differ")
    for (ins, got, grads) in ((ins1, got1, grads1), (ins3, got3, None)):
        bad = _judge_call(p, want, ins, got, grads)
        if bad:
            return Failure(p, bad)
    # other numbers on the next call; independence within and across calls
    n0 = p.n_outs
    inds1, inds3 = _indicators(p, ins1, got1), _indicators(p, ins3, got3)
    for k, line in enumerate(p.randoms):
        a, b = got1[n0 + k].detach(), got3[n0 + k].detach()
        readable = line.kind != "dropout" or inds1[k] is not None   # a 0 input hides the mask
        if readable and _repeat_chance(line, a) < 1e-9 and torch.equal(a.nan_to_num(7.0),
                                                          b.nan_to_num(7.0)):
            return Failure(p, f"random value {line.name}: the next call drew the same numbers")
        if inds1[k] is not None and inds3[k] is not None:
            bad = _joint_ok(inds1[k], inds3[k])
            if bad:
                return Failure(p, f"{line.name} and the next call's: {bad}")
        for j in range(k):
            if inds1[k] is not None and inds1[j] is not None:
                bad = _joint_ok(inds1[k], inds1[j])
                if bad:
                    return Failure(p, f"{line.name} and {p.randoms[j].name}: {bad}")
    for k, ind in enumerate(inds1):
        if ind is not None:
            n, kept = ind[0].numel(), int(ind[0].sum())
            p.stats.setdefault("tested", []).append((n, kept, ind[1]))
    return None


def _repeat_chance(line: RandomLine, a: torch.Tensor) -> float:
    n = a.numel()
    if line.kind == "dropout" or line.kind == "bernoulli_p":
        q = 1.0 - line.p if line.kind == "dropout" else line.p
        return max(q, 1 - q) ** n
    if line.kind == "bernoulli_t":
        return 1.0
    if line.kind == "uniform" and line.hi == line.lo:
        return 1.0
    bits = {F32: 24, F16: 11, BF16: 8}.get(a.dtype, 8)
    return 2.0 ** (-min(bits, 8) * n)


def _replay_env(p: RandProgram, ins: list, got: list):
    """The values each random line read in the replay of a call (for the laws), by running
    the replay with a recording _R."""
    seen = {}

    def R(k, v):
        seen[k] = v.detach() if isinstance(v, torch.Tensor) else None
        return got[p.n_outs + k].detach().clone()
    ns = {"torch": torch, "F": F, "_R": R}
    exec(compile(replay_source(p), "<replay-args>", "exec"), ns)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ns["f"](*[x.detach() if isinstance(x, torch.Tensor) else x for x in ins])
    return seen


def _indicators(p: RandProgram, ins, got) -> list:
    seen = _replay_env(p, p.make_inputs(), got)
    return [_indicator(line, seen.get(k), got[p.n_outs + k])
            for k, line in enumerate(p.randoms)]


def _judge_call(p: RandProgram, want, ins, got, grads) -> Optional[str]:
    """One compiled call against the eager draw's laws and the replay of its own draws."""
    if len(got) != len(want):
        return f"{len(got)} outputs, eager {len(want)}"
    n0 = p.n_outs
    for k, line in enumerate(p.randoms):
        bad = _law(line, got[n0 + k], want[n0 + k])
        if bad:
            return f"random value {line.name} ({line.kind}): {bad}"
    seen = _replay_env(p, p.make_inputs(), got)
    for k, line in enumerate(p.randoms):
        ind = _indicator(line, seen.get(k), got[n0 + k])
        if ind is not None:
            bad = _rate_ok(*ind)
            if bad:
                return f"random value {line.name} ({line.kind} p={line.p}): {bad}"
    ambiguous: list = []
    rins = p.make_inputs()
    replay = _replay_fn(p, list(got[n0:]), ambiguous)
    try:
        ref = _call(replay, p, rins)
    except Exception as e:  # noqa: BLE001
        return f"the replay raised {type(e).__name__}: {e}"
    for i, (g, w) in enumerate(zip(got, ref)):
        tag = f"output {i}" + (f" ({p.randoms[i - n0].name}, {p.randoms[i - n0].kind})"
                               if i >= n0 else "")
        bad = _compare(tag + " against the replay", g, w, p.loosest)
        if bad:
            return bad
        if g.requires_grad != want[i].requires_grad:
            return f"output {i}: requires_grad {g.requires_grad}, eager {want[i].requires_grad}"
    for i, (a, b) in enumerate(zip(ins, rins)):
        bad = _compare(f"input {i} after the call", a.detach(), b.detach(), p.loosest)
        if bad:
            return bad
    if grads is not None:
        if ambiguous:
            p.stats["grads_not_compared"] = p.stats.get("grads_not_compared", 0) + 1
            return None
        rgrads = _grads(p, ref, rins)
        if rgrads is None:     # only draws hold a gradient (zero): nothing to compare
            return None
        for i, (a, b) in enumerate(zip(grads, rgrads)):
            # a gradient only through draws (bernoulli's is zeros) is None in the replay
            if b is None and a is not None and not bool(a.any()):
                continue
            bad = _compare(f"grad of x{i} against the replay", a, b, p.loosest, grad=True)
            if bad:
                return bad
        p.stats["grads_compared"] = p.stats.get("grads_compared", 0) + 1
    return None


def dump(p: RandProgram, path: str) -> None:
    """The outputs (and gradients) of p's compiled call after torch.manual_seed(seed + 1), to
    `path` (torch.save): two pyfuser versions whose kernels draw the same numbers write equal
    files."""
    import pyfuser
    from pyfuser.frontend.fx import reset_compiled
    from pyfuser.frontend.fx.compile_graph import clear_cache
    torch._dynamo.reset()
    reset_compiled()
    clear_cache()
    compiled = torch.compile(p.function(), backend=pyfuser.backend, dynamic=False)
    res = {}
    for call in range(2):
        torch.manual_seed(p.seed + 1)
        ins = p.make_inputs()
        try:
            got = _call(compiled, p, ins)
            grads = _grads(p, got, ins) if p.grad else None
            res[call] = ([g.detach() for g in got],
                         [g for g in grads] if grads is not None else None)
        except Exception as e:  # noqa: BLE001
            res[call] = repr(e)[:200]
    torch._dynamo.reset()
    torch.save(res, path)


def run_many(seeds):
    for s in seeds:
        p = generate(s)
        yield p, check(p)
