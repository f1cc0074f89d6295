"""Random cross-entropy programs for differential fuzzing of picks (a sum over the row of
where(iota == index, X, 0) read as one element; schedule/reduction_patterns.py) through
`pyfuser.compile` against eager PyTorch on the CPU interpreter.

A case is F.cross_entropy (mean / sum / none, an ignore_index, label smoothing, class weights),
F.nll_loss of log-probabilities (log_softmax, x - logsumexp, the max / log-sum written out)
through a chain of pointwise ops, or the target's log-probability by torch.gather, with
pointwise transforms of the logits before (scales, a bias row, casts, clamps, soft-capping) and
of the loss after, over 1-40 rows of 1-3000 classes, float32 / bfloat16 / float16 logits laid
out contiguous, transposed, sliced or strided, 2-D or 3-D (batch, seq, classes: flattened as HF
models do, shifted as causal LMs do, or with the classes at dim 1), targets partly (or all)
ignored, without grad (most) or with a backward whose gradient is compared too.

`case(i)` is reproducible from the seed alone; `check(i)` returns None or a one-line failure;
`run(i)` also returns what fell back to eager or to the evaluator (`notes`). A value passes
when within the case's dtype tolerance of eager's (float32 1e-5, float16 5e-3, bfloat16 2e-2,
relative and absolute: the lowest precision any step of the program rounds to), or no farther
from the float64 result (the program without its casts) than twice eager's distance plus that
tolerance (eager's own rounding, e.g. a float16 sum over the rows). NaN positions, dtypes and
shapes must be eager's. `python tests/cpu/pick_fuzz.py START COUNT` is the long run.
"""
from __future__ import annotations

import logging
import os
import random
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch

F = torch.nn.functional
DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float64: 1e-5}
CLASSES = [1, 1, 2, 3, 5, 17, 32, 64, 100, 127, 128, 255, 256, 500, 1000, 1024, 1031, 2048,
           2999, 3000]
PROGRAMS = ["ce", "ce", "ce", "nll", "nll", "gather", "gather_lse", "ce_kdim"]
LOGPROBS = ["log_softmax", "log_softmax_f32", "lse", "written", "log_softmax_dtype"]
KNOBS = [{}, {}, {}, {"PYFUSER_RED_ONLINE": "0"}, {"PYFUSER_RED_STEPS": "0"},
         {"PYFUSER_RED_STEPS": "1"}, {"PYFUSER_RED_CLUSTER": "2", "PYFUSER_RED_STEPS": "1"},
         {"PYFUSER_RED_CLUSTER": "4", "PYFUSER_RED_STEPS": "1", "PYFUSER_RED_STAGE": "1"},
         {"PYFUSER_RED_STAGE": "1"}, {"PYFUSER_RED_SHIFTED_EXP": "0"}, {"PYFUSER_RED_PICK": "0"},
         {"PYFUSER_RED_BDIMX": "32", "PYFUSER_RED_UNROLL": "1"}, {"PYFUSER_RED_FULL": "1"}]


@dataclass
class Case:
    seed: int
    program: str
    dtype: str
    shape: tuple                 # (rows, classes) or (batch, seq, classes)
    layout: str
    flatten: str                 # 3-D: view / reshape / shift
    pre: list = field(default_factory=list)      # transforms of the logits
    logprobs: str = "log_softmax"                # nll / gather programs
    chain: list = field(default_factory=list)    # pointwise ops of the log-probabilities
    post: list = field(default_factory=list)     # transforms of the loss
    reduction: str = "mean"
    ignore_index: int = -100
    ignored: float = 0.0
    smoothing: float = 0.0
    weighted: bool = False
    extra: str = ""              # a second output: lse / probs, or a z-loss added
    grad: str = "no_grad"        # no_grad / enabled / backward
    scale: float = 1.0
    offset: float = 0.0
    special: bool = False        # some logits -inf (never a target's)
    also: str = ""               # a second pick added: of the targets flipped, of a bias row
    knobs: dict = field(default_factory=dict)    # reduction knobs (environment)
    again: str = ""              # a second call: other rows / classes / layout (`again`)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.__dict__.items())


def case(seed: int) -> Case:
    r = random.Random(seed)
    program = r.choice(PROGRAMS)
    c = r.choice(CLASSES) if r.random() < 0.7 else r.randint(1, 3000)
    three = program == "ce_kdim" or r.random() < 0.3
    if three:
        b = r.choice([1, 2, 3, 4])
        shape = (b, r.randint(2 if program != "ce_kdim" else 1, 40 // b), c)
        layouts, flatten = ["contiguous", "permuted", "sliced", "classes_first"], \
            r.choice(["view", "reshape", "shift"] + ["keep"] * 2 * program.startswith("gather"))
    else:
        shape = (r.choice([1, 2, 3, 7, 8, 16, 31, 40, r.randint(1, 40)]), c)
        layouts, flatten = ["contiguous", "transposed", "sliced", "row_step", "col_step"], ""
    layout = "contiguous" if r.random() < 0.4 else r.choice(layouts)
    pre = [r.choice([("scale", r.choice([0.5, 2.0, 3.0])), ("bias",), ("cast", r.choice(list(DT))),
                     ("clamp", r.choice([2.0, 5.0])), ("softcap", r.choice([5.0, 30.0])),
                     ("tanh",)]) for _ in range(r.choice([0, 0, 1, 1, 2, 3]))]
    chain = [r.choice([("scale", r.choice([0.5, 2.0])), ("add", r.choice([-1.0, 0.25])),
                       ("round", r.choice(["bf16", "f16"])), ("clamp_min", -20.0), ("rowmax",),
                       ("rowmean",), ("rowmask",), ("rowt",)])
             for _ in range(r.choice([0, 1, 1, 2, 3]))] if program == "nll" else []
    post = [r.choice([("scale", 0.5), ("float",), ("add", 1.0)])] if r.random() < 0.3 else []
    ignore_index = r.choice([-100, -100, -1, r.randrange(c), c + 3])
    return Case(seed, program, r.choice(["f32", "f32", "bf16", "f16"]), shape, layout, flatten,
                pre, r.choice(LOGPROBS), chain, post, r.choice(["mean", "sum", "none"]),
                ignore_index, r.choice([0.0, 0.0, 0.2, 0.5, 1.0]),
                r.choice([0.1, 0.3, 1.0]) if program.startswith("ce") and r.random() < 0.35
                else 0.0, r.random() < 0.2, r.choice(["", "", "", "lse", "probs", "zloss"]),
                r.choice(["no_grad"] * 13 + ["enabled"] + ["backward"] * 6),
                r.choice([1.0, 3.0, 10.0]), r.choice([0.0, 0.0, 20.0]), r.random() < 0.1,
                r.choice(["", "", "", "flip", "bias", "logit"]), r.choice(KNOBS),
                r.choice(["", "", "", "", "rows", "classes", "layout"]))


def inputs(c: Case) -> tuple:
    """(logits x, targets t, class weights w, bias row b), x laid out as c.layout says."""
    g = torch.Generator().manual_seed(c.seed)
    *lead, n = c.shape
    v = torch.randn(*c.shape, generator=g, dtype=torch.float64) * c.scale + c.offset
    t = torch.randint(0, n, lead, generator=g)
    t[torch.rand(lead, generator=g) < c.ignored] = c.ignore_index
    if c.special and n > 1:
        hole = (torch.rand(c.shape, generator=g) < 0.2) & \
            (torch.arange(n) != t.clamp(0, n - 1)[..., None])
        v = v.masked_fill(hole, float("-inf"))
    v = v.to(DT[c.dtype])
    big = list(c.shape)
    big[-1 if c.layout in ("sliced", "col_step") else 0] *= 2
    base = torch.zeros(big, dtype=v.dtype)
    window = {"sliced": (..., slice(1, n + 1)), "col_step": (slice(None), slice(None, None, 2)),
              "row_step": (slice(None, None, 2),)}.get(c.layout)
    if window is not None:
        base[window] = v
        x = base[window]
    else:
        x = {"transposed": lambda: v.t().contiguous().t(),
             "permuted": lambda: v.transpose(0, 1).contiguous().transpose(0, 1),
             "classes_first": lambda: v.permute(2, 0, 1).contiguous().permute(1, 2, 0)
             }.get(c.layout, lambda: v)()
    w = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    b = torch.randn(n, generator=g, dtype=torch.float64).to(DT[c.dtype])
    return x, t, w, b


def _to(x, dt, ref):
    return x if ref else x.to(dt)


def _pre(c, x, b, ref):
    for op, *a in c.pre:
        x = {"scale": lambda: x * a[0], "bias": lambda: x + b,
             "cast": lambda: _to(x, DT[a[0]], ref),
             "clamp": lambda: x.clamp(-a[0], a[0]), "softcap": lambda: a[0] * torch.tanh(x / a[0]),
             "tanh": lambda: torch.tanh(x) * 3}[op]()
    return x


def _logprobs(c, x, ref):
    if c.logprobs == "log_softmax_f32":
        return F.log_softmax(_to(x, torch.float32, ref), -1)
    if c.logprobs == "log_softmax_dtype" and not ref:
        return F.log_softmax(x, -1, dtype=torch.float32)
    if c.logprobs == "lse":
        return x - x.logsumexp(-1, keepdim=True)
    if c.logprobs == "written":
        s = x - x.amax(-1, keepdim=True)
        return s - s.exp().sum(-1, keepdim=True).log()
    return F.log_softmax(x, -1)


def _chain(c, lp, x, t, ref):
    """Pointwise ops of the log-probabilities lp, with constants or row values (of the logits
    x, of the targets t)."""
    for op, *a in c.chain:
        lp = {"scale": lambda: lp * a[0], "add": lambda: lp + a[0],
              "round": lambda: lp if ref else lp.to(DT[a[0]]).to(lp.dtype),
              "clamp_min": lambda: lp.clamp_min(a[0]),
              "rowmax": lambda: lp - lp.amax(-1, keepdim=True),
              "rowmean": lambda: lp - 0.1 * x.mean(-1, keepdim=True),
              "rowmask": lambda: lp * (t != c.ignore_index)[:, None],
              "rowt": lambda: lp * (1 + (t[:, None] % 3))}[op]()
    return lp


def _also(c, x, t, b, w, ref):
    """A second pick of the same reduction: the targets flipped, a bias row, the raw logits."""
    kw = dict(weight=w, ignore_index=c.ignore_index, reduction=c.reduction)
    if c.also == "flip":
        return 0.5 * F.nll_loss(F.log_softmax(x, -1), t.flip(0), **kw)
    if c.also == "bias":
        return F.nll_loss(_to(b, x.dtype, ref).expand(x.shape), t, **kw)
    return F.nll_loss(x, t, **kw) * 0.01


def _gathered(c, x, t, w, ref):
    """The target's negative log-probability by gather, masked and reduced as nll_loss is."""
    keep = t != c.ignore_index
    ts = torch.where(keep, t, 0)
    if c.program == "gather":
        picked = _logprobs(c, x, ref).gather(-1, ts[..., None]).squeeze(-1)
    else:
        picked = x.gather(-1, ts[..., None]).squeeze(-1) - x.logsumexp(-1)
    wt = w[ts] * keep if w is not None else keep.to(picked.dtype)
    loss = -picked * wt
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / wt.sum()}[c.reduction]


def program(c: Case):
    """The case's function of (x, t, w, b) and whether it is the float64 reference."""
    def f(x, t, w, b, ref=False):
        x = _pre(c, x, b, ref)
        if c.program == "ce_kdim":
            lead, x2, t2 = x.shape[:-1], x.transpose(1, 2), t
        else:
            lead, x2, t2 = _flat(c, x, t)
        lp = _chain(c, _logprobs(c, x2, ref), x2, t2, ref) if c.program == "nll" else x2
        w = None if not c.weighted else (w if ref else w.to(lp.dtype))
        kw = dict(weight=w, ignore_index=c.ignore_index, reduction=c.reduction)
        if c.program.startswith("ce"):
            loss = F.cross_entropy(x2, t2, label_smoothing=c.smoothing, **kw)
        elif c.program == "nll":
            loss = F.nll_loss(lp, t2, **kw)
        else:
            loss = _gathered(c, x2, t2, w, ref)
        if c.also and x2.dim() == 2:
            loss = loss + _also(c, x2, t2, b, None if w is None else _to(w, x2.dtype, ref), ref)
        for op, *a in c.post:
            loss = {"scale": lambda: loss * 0.5, "float": lambda: _to(loss, torch.float32, ref),
                    "add": lambda: loss + 1.0}[op]()
        lse = x2.float().logsumexp(1 if c.program == "ce_kdim" else -1) if not ref else \
            x2.logsumexp(1 if c.program == "ce_kdim" else -1)
        if c.extra == "zloss":
            z = lse.mean() if c.reduction != "none" else lse.reshape(loss.shape)
            return loss + 1e-4 * z ** 2
        if c.extra == "lse":
            return loss, lse
        if c.extra == "probs":
            return loss, x2.softmax(1 if c.program == "ce_kdim" else -1)
        return loss
    return f


def _flat(c, x, t):
    if x.dim() == 2 or c.flatten == "keep":      # gather programs: 3-D as it is
        return x.shape[:-1], x, t
    n = x.shape[-1]
    if c.flatten == "shift":
        x, t = x[:, :-1, :], t[:, 1:]
        return x.shape[:-1], x.reshape(-1, n), t.reshape(-1)
    if c.flatten == "view":
        x = x.contiguous()
        return x.shape[:-1], x.view(-1, n), t.reshape(-1)
    return x.shape[:-1], x.reshape(-1, n), t.reshape(-1)


def _lowest(c: Case, outs) -> torch.dtype:
    dts = [DT[c.dtype]] + [DT[a[0]] for op, *a in c.pre + c.chain if op in ("cast", "round")] + \
        [o.dtype for o in outs]
    return max(dts, key=lambda d: TOL[d])


def _compare(name, got, want, ref, tol) -> str | None:
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{name}: {got.dtype} {tuple(got.shape)}, eager {want.dtype} " \
            f"{tuple(want.shape)}"
    if not torch.equal(got.isnan(), want.isnan()):
        return f"{name}: NaN positions differ ({int(got.isnan().sum())} NaNs, eager " \
            f"{int(want.isnan().sum())})"
    try:
        torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, equal_nan=True)
        return None
    except AssertionError as e:
        ref = ref.double()
        ours = (got.double() - ref).abs().nan_to_num(0, 0, 0)
        theirs = (want.double() - ref).abs().nan_to_num(0, 0, 0)
        if bool((ours <= 2 * theirs + tol * ref.abs().nan_to_num(0, 0, 0).clamp_min(1)).all()) \
                and torch.equal(got.isinf(), want.isinf()):
            return None
        return f"{name}: {' '.join(str(e).split())[:200]}; from float64 " \
            f"{float(ours.max()):.3g}, eager {float(theirs.max()):.3g}"


def _call(f, c, x, t, w, b, ref=False):
    """(outputs as a tuple, x's gradient or None)."""
    x = x.detach().clone() if not ref else x.detach().double()
    if ref:
        w, b = w.double(), b.double()
    if c.grad == "backward":
        x.requires_grad_(True)
    with torch.set_grad_enabled(c.grad != "no_grad"):
        out = f(x, t, w, b, ref) if ref else f(x, t, w, b)
    outs = out if isinstance(out, tuple) else (out,)
    if c.grad != "backward":
        return outs, None
    seed = torch.Generator().manual_seed(c.seed + 1)
    gs = [torch.randn(o.shape, generator=seed, dtype=torch.float64).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, gs)
    return tuple(o.detach() for o in outs), x.grad


class _Notes(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.seen = []

    def emit(self, record):
        self.seen.append(record.getMessage())


def _fallbacks(handler) -> list:
    """What ran outside pyfuser's kernels: unfused nodes, eager segments, evaluator runs, logs."""
    from pyfuser.frontend.fx import compiled_graphs
    from pyfuser.runtime import dispatch
    notes = list(handler.seen)
    for g in compiled_graphs():
        notes += [f"{g.kind}: unfused: {why}" for why in g.report()["unfused"]]
        for r in g.regions:
            rep = dispatch.last_report(r.fusion)
            if rep is None:
                continue
            notes += [f"{g.kind}: {s.kind} segment on {s.backend}: {' '.join(s.exprs[:6])}" for s
                      in rep.segments if s.kind == "eager" or s.backend == "evaluator"]
            notes += [f"{g.kind}: kernel {s.scheduler}" for s in rep.segments if s.kind == "kernel"]
    return notes


def again(c: Case) -> Case | None:
    """The input of a second call of the same compiled function (no reset: Dynamo recompiles,
    its shapes dynamic): other rows, other classes or another layout, or None."""
    if not c.again:
        return None
    r = random.Random(c.seed + 7919)
    shape, layout = list(c.shape), c.layout
    if c.again == "rows":
        shape[0] = r.randint(1, 40 // (shape[1] if len(shape) == 3 else 1))
    elif c.again == "classes":
        shape[-1] = r.randint(1, 3000)
    else:
        layout = r.choice(["contiguous", "sliced"] + (["transposed", "row_step", "col_step"]
                          if len(shape) == 2 else ["permuted", "classes_first"]))
    return Case(**{**c.__dict__, "seed": c.seed + 7919, "shape": tuple(shape), "layout": layout,
                   "ignore_index": c.ignore_index if c.ignore_index < 0 else
                   min(c.ignore_index, shape[-1] - 1)})


def _one(f, compiled, c: Case) -> str | None:
    x, t, w, b = inputs(c)
    try:
        want, want_g = _call(f, c, x, t, w, b)
    except Exception as e:  # noqa: BLE001 - eager refuses: pyfuser must refuse too
        try:
            _call(compiled, c, x, t, w, b)
        except Exception:  # noqa: BLE001
            return None
        return f"eager raises ({str(e).splitlines()[0]}), compiled does not"
    try:
        got, got_g = _call(compiled, c, x, t, w, b)
    except Exception as e:  # noqa: BLE001 - a crash is a finding
        return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    ref, ref_g = _call(f, c, x, t, w, b, ref=True)
    tol = TOL[_lowest(c, want)]
    pairs = list(zip(got, want, ref)) + ([(got_g, want_g, ref_g)] if want_g is not None else [])
    for k, (a, e, r) in enumerate(pairs):
        why = _compare("grad" if k == len(got) else f"output {k}", a, e, r, tol)
        if why:
            return why
    return None


def run(seed: int) -> tuple:
    """(None or the failure, notes: fallbacks and the schedulers of the kernels that ran)."""
    import pyfuser
    from pyfuser.frontend.fx import reset_compiled
    from pyfuser.frontend.fx.compile_graph import clear_cache
    from pyfuser.runtime import dispatch, executor
    c = case(seed)
    f = program(c)
    torch._dynamo.reset()
    reset_compiled()
    clear_cache()
    dispatch.clear_caches()
    executor._logged_reasons.clear()
    saved = {k: os.environ.get(k) for k in c.knobs}
    os.environ.update(c.knobs)
    handler, log = _Notes(), logging.getLogger("pyfuser")
    log.addHandler(handler)
    old = log.level
    log.setLevel(logging.INFO)
    try:
        compiled = pyfuser.compile(f)
        for k, ck in enumerate([c, again(c)]):
            why = _one(f, compiled, ck) if ck is not None else None
            if why:
                return f"seed {seed}{' (second call)' if k else ''}: {why} | {ck.describe()}", \
                    _fallbacks(handler)
        return None, _fallbacks(handler)
    finally:
        log.removeHandler(handler)
        log.setLevel(old)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check(seed: int) -> str | None:
    return run(seed)[0]


def main(start: int, count: int) -> None:
    """Run cases start..start+count-1; print failures, fallback reasons and kernel counts."""
    import time
    from pyfuser.schedule import reduction_patterns as RP
    seen, fails, t0, picked = Counter(), [], time.time(), []
    pick_of = RP._pick_of

    def counted(g, node):                  # whether the case's fusions found a pick
        p = pick_of(g, node)
        picked.append(p is not None)
        return p
    RP._pick_of = counted
    for s in range(start, start + count):
        picked.clear()
        why, notes = run(s)
        c = case(s)
        notes.append(f"{c.program} (weighted={c.weighted}, {c.grad}): "
                     f"{'a pick found' if any(picked) else 'no pick found'}")
        seen.update(set(notes))
        if why:
            fails.append(why)
            print("FAIL", why, flush=True)
    print(f"{count} cases, {len(fails)} failures, {time.time() - t0:.0f} s")
    for note, n in seen.most_common():
        print(f"{n:5d}  {note}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
