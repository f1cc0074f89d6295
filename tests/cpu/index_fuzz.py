"""Random cases of advanced indexing for differential fuzzing: `t[i0, ..., ik-1]` of a table's k
leading axes by integer index tensors (lowering/aten_indexing.py), and its gradient (the
accumulating `index_put`), through pyfuser against eager.

Case i is `case(i)`, reproducible from its seed alone: a table of rank 1-4 (float32, bfloat16 or
float64; contiguous, transposed, sliced with a step or expanded from a size-1 axis, the view
taken outside the compiled function or inside it), k = 1..rank index tensors of ranks 0-3 that
broadcast together (size-1 axes; int64 or int32, mixed too; negative entries), a pointwise op
on the table before the lookup, one on the result after it, sometimes an index computed in the
graph (`i - n`: the negatives made by a kernel; `arange(n)` as the first of `rank` indices, the
arange rewrite's form), index inputs with an expanded (stride 0) or a transposed layout, a sum
or a softmax after the lookup; a fifth of the cases accumulate values at the indices instead
(`t.index_put(idx, v, accumulate=True)`, or `index_put_` into zeros, then t added). Some cases
put one index outside its axis (eager's IndexError), give the table or an index an empty axis
(a zero-size trailing axis, an empty indexed axis, an empty index), run the gradient
with respect to the table's leaf, compile with dynamic=True and run two sizes, or trace the
function for the TorchScript graph fuser (`pyfuser.jit(torch.jit.trace(...))`, interpreted).

`check(c)` returns None or the failure's description. The forward must be eager's bit for bit
(a lookup, then ops eager rounds as the kernel does), of eager's shape and dtype; sums (the
gradient, index_put's forward, a reduction after the lookup) as close to float64 eager's as
float32 / bfloat16 eager's is (train_corpus's
assert_as_close_as_eager); where eager raises, pyfuser must raise (an IndexError where eager's
is one), never return a result; where eager returns, pyfuser must return the same (an exception
there is a failure too, for the reader to judge). A traced graph whose one index is of the first
axis must group that index (no `aten::index` fallback).

`python tests/cpu/index_fuzz.py START COUNT` is the long run; tests/cpu/test_index_fuzz.py runs
a few cases (PYFUSER_INDEX_FUZZ_CASES for more).
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float64)
PRE = {"none": lambda t: t, "mul2": lambda t: t * 2, "add1": lambda t: t + 1,
       "neg": lambda t: -t, "sin": lambda t: t.sin()}
POST = {"none": lambda y: y, "mul3": lambda y: y * 3, "add1": lambda y: y + 1,
        "relu": lambda y: y.relu(), "abs": lambda y: y.abs(), "sin2": lambda y: (y * 2).sin(),
        "sum": lambda y: y.sum(-1) if y.ndim else y, "softmax": lambda y: y.softmax(-1) if y.ndim else y}
INEXACT = ("sum", "softmax")    # reductions after the lookup: sums in another order than eager's


@dataclass
class Case:
    seed: int
    shape: list                 # the table's shape (the first of two under `dynamic`)
    dtype: torch.dtype
    layout: str                 # contiguous / transposed / sliced / expanded
    view_inside: bool           # the layout's view op inside the compiled function
    layout_axis: int
    k: int
    index_shapes: list          # one shape per index tensor
    index_dtypes: list
    pre: str
    post: str
    index_op: str               # none / minus_n (i - n of a non-negative i) / arange (index 0)
    bad: tuple | None           # (index number, d) of one entry outside its axis of size n: n + d
                                # for d >= 0, -n + d for d < 0 (outside at every size)
    grad: bool
    dynamic: bool
    shape2: list | None = None  # the second size's table (dynamic)
    index_shapes2: list | None = None
    traced: bool = False
    index_layout: str = "contiguous"  # of the index inputs: contiguous / expanded / transposed
    put: str = "none"           # none / input (t.index_put(idx, v, True)) / zeros (of zeros)
    notes: list = field(default_factory=list)

    def __str__(self):
        d = {k: v for k, v in self.__dict__.items() if k != "notes"}
        return "Case(" + ", ".join(f"{k}={v}" for k, v in d.items()) + ")"


def _broadcast_shape(rng: random.Random, dynamic: bool, empty: bool) -> list:
    rank = rng.choice([0, 1, 1, 1, 2, 2, 2, 3, 3])
    lo = 2 if dynamic else 1
    shape = [rng.randint(lo, 4) for _ in range(rank)]
    if empty and rank:
        shape[rng.randrange(rank)] = 0
    return shape


def _index_shapes(rng: random.Random, k: int, full: list, dynamic: bool) -> list:
    """k shapes that broadcast to `full`: each a suffix of it, some axes 1 (not under dynamic,
    where a 1 would be a specialization of its own, nor the rank, so the second size keeps the
    same broadcasting)."""
    shapes = []
    for _ in range(k):
        # a 0-dim index is rare: Python's indexing takes it as an int (`.item()`), which
        # AOTAutograd cannot trace (Dynamo runs the graph eagerly, for any backend)
        r = 0 if rng.random() < 0.08 else rng.randint(min(1, len(full)), len(full))
        s = list(full[len(full) - r:])
        if not dynamic:
            s = [1 if rng.random() < 0.25 else n for n in s]
        shapes.append(s)
    if full and not any(len(s) == len(full) and s == full for s in shapes) and \
            all(len(s) < len(full) for s in shapes):
        shapes[rng.randrange(k)] = list(full)     # the result has the broadcast rank
    return shapes


def case(seed: int) -> Case:
    rng = random.Random(seed)
    rank = rng.randint(1, 4)
    k = rng.randint(1, rank)
    dynamic = rng.random() < 0.2
    traced = not dynamic and rng.random() < 0.15
    lo = 2 if dynamic else 1
    shape = [rng.randint(lo, 6) for _ in range(rank)]
    if rng.random() < 0.15:                          # rows of vector loads, tables of more rows
        shape[0] = rng.randint(20, 300)
        if rank > k:
            shape[-1] = rng.choice([1, 3, 8, 16, 33, 64, 128, 257])
    zero = None if dynamic or rng.random() >= 0.12 else \
        rng.choice(["trailing", "index", "table"] if rank > k else ["index", "table"])
    if zero == "trailing":
        shape[-1] = 0                                # a zero-size trailing axis
    if zero == "table":                              # an empty indexed axis (and empty indices)
        shape[rng.randrange(k)] = 0
    full = _broadcast_shape(rng, dynamic, zero in ("index", "table"))
    layout = rng.choice(["contiguous", "contiguous", "transposed", "sliced", "expanded"])
    if layout == "transposed" and rank < 2:
        layout = "sliced"
    if layout == "expanded" and dynamic:
        layout = "contiguous"
    c = Case(seed=seed, shape=shape, dtype=rng.choice(DTYPES), layout=layout,
             view_inside=rng.random() < 0.5, layout_axis=rng.randrange(rank), k=k,
             index_shapes=_index_shapes(rng, k, full, dynamic),
             index_dtypes=[rng.choice([torch.int64, torch.int64, torch.int32])] * k,
             pre=rng.choice(list(PRE)), post=rng.choice(list(POST)),
             index_op=rng.choice(["none"] * 6 + ["minus_n", "arange"]), bad=None,
             grad=rng.random() < 0.5, dynamic=dynamic, traced=traced)
    if rng.random() < 0.2:
        c.index_dtypes = [rng.choice([torch.int64, torch.int32]) for _ in range(k)]
    if c.index_op == "arange":       # arange(n) of the first axis, with indices of every axis
        if k == rank and not dynamic and shape[0] > 0:
            c.index_shapes = _index_shapes(rng, k, [shape[0]], False)
            c.index_shapes[0] = [shape[0]]
        else:
            c.index_op = "none"
    if rng.random() < 0.15:
        j = rng.randrange(k)
        c.bad = (j, rng.choice([0, rng.randint(1, 3), -1, -rng.randint(2, 4)]))
        if c.index_op == "arange" and j == 0:
            c.index_op = "none"
    if dynamic:
        c.shape2 = [n + rng.randint(1, 3) for n in shape]
        grow = rng.randint(0, 2)
        c.index_shapes2 = [[n + grow if n > 1 else n for n in s] for s in c.index_shapes]
    if not traced and rng.random() < 0.2:
        c.put = rng.choice(["input", "zeros"])
        c.index_op = "none" if c.index_op == "arange" else c.index_op
    if rng.random() < 0.2:
        c.index_layout = rng.choice(["expanded", "transposed"])
    if c.dtype == torch.bfloat16 and c.pre == "sin":
        c.pre = "mul2"                   # keep the forward's rounding eager's (one sin, then a cast)
    return c


def _indices(c: Case, shape: list, index_shapes: list, gen: torch.Generator) -> list:
    """The index tensors: values in [-n, n) of their axis (one outside it under `bad`), laid out
    as `index_layout` says: "expanded" makes the first axis longer than 1 an expand of one
    slice (stride 0), "transposed" gives the last two axes a transposed layout."""
    out = []
    for j, (s, dt) in enumerate(zip(index_shapes, c.index_dtypes)):
        n = shape[j]
        drawn = list(s)
        wide = [a for a, m in enumerate(s) if m > 1]
        if c.index_layout == "expanded" and wide:
            drawn[wide[0]] = 1
        if n == 0:
            i = torch.zeros(drawn, dtype=torch.int64)
        elif c.index_op == "minus_n" and j == 0:
            i = torch.randint(0, n, drawn, generator=gen)        # the graph subtracts n
        else:
            i = torch.randint(-n, n, drawn, generator=gen)
        if c.bad is not None and c.bad[0] == j and i.numel():
            flat = i.view(-1)
            flat[torch.randint(0, flat.numel(), (), generator=gen)] = \
                (n + c.bad[1] if c.bad[1] >= 0 else -n + c.bad[1]) + \
                (n if c.index_op == "minus_n" and j == 0 else 0)
        i = i.to(dt).expand(s)
        if c.index_layout == "transposed" and i.ndim >= 2:
            i = i.transpose(-1, -2).contiguous().transpose(-1, -2)
        out.append(i)
    return out


def _leaf_and_view(c: Case, shape: list, gen: torch.Generator):
    """(leaf's values, view(leaf) -> the table): the layout's base and the view taking it to
    the table's shape."""
    a = c.layout_axis
    if c.layout == "transposed":
        b = (a + 1) % len(shape)
        base = list(shape)
        base[a], base[b] = base[b], base[a]
        return torch.randn(base, generator=gen), lambda t: t.transpose(a, b)
    if c.layout == "sliced":
        base = list(shape)
        base[a] = 2 * shape[a]                   # every other element: strides of 2
        return torch.randn(base, generator=gen), lambda t: t[(slice(None),) * a + (slice(0, None, 2),)]
    if c.layout == "expanded":
        base = list(shape)
        base[a] = 1
        return torch.randn(base, generator=gen), lambda t: t.expand(shape)
    return torch.randn(shape, generator=gen), lambda t: t


def program(c: Case, view):
    """fn(t, v, *idx): the lookup `post(pre(t)[idx])`, or under `put` the accumulation of the
    values v at idx (into pre(t), or into zeros of t's shape and dtype, then t added)."""
    pre, post, inside = PRE[c.pre], POST[c.post], c.view_inside

    def fn(t, v, *idx):
        if inside:
            t = view(t)
        t = pre(t)
        idx = list(idx)
        if c.index_op == "minus_n":
            idx[0] = idx[0] - t.shape[0]
        elif c.index_op == "arange":
            idx[0] = torch.arange(t.shape[0])
        if c.put == "input":
            return post(t.index_put(tuple(idx), v, accumulate=True))
        if c.put == "zeros":
            y = torch.zeros(t.shape, dtype=t.dtype)
            y.index_put_(tuple(idx), v, accumulate=True)
            return post(y + t)
        return post(t[tuple(idx)])
    return fn


def _values(c: Case, shape: list, index_shapes: list, gen: torch.Generator):
    """The values `put` accumulates: the indices' broadcast shape, then the table's other axes
    (None for a lookup)."""
    if c.put == "none":
        return None
    full = list(torch.broadcast_shapes(*[tuple(s) for s in index_shapes]))
    return torch.randn(full + list(shape[c.k:]), generator=gen)


def _run(impl, c: Case, view, base, dtype, idx, grad: bool, v=None):
    leaf = base.to(dtype).requires_grad_(grad)
    t = leaf if c.view_inside else view(leaf)
    out = impl(t, None if v is None else v.to(dtype), *idx)
    if not grad:
        return out.detach(), None
    loss = out.double().square().sum() if dtype == torch.float64 else out.float().square().sum()
    (g,) = torch.autograd.grad(loss, leaf)
    return out.detach(), g


def _outcome(thunk):
    try:
        return thunk(), None
    except Exception as e:                  # noqa: BLE001  (what eager and pyfuser raise is compared)
        return None, e


def _close(got, eager, oracle, what: str) -> str | None:
    """None where `got` is as close to the float64 oracle as eager's result is (train_corpus's
    measure; bfloat16 results against the oracle rounded to bfloat16, as the tests do)."""
    from train_corpus import assert_as_close_as_eager
    if not got.numel():
        return None
    if got.dtype == torch.float64:
        if not torch.allclose(got, eager, rtol=1e-12, atol=1e-12, equal_nan=True):
            return f"{what}: float64 result differs ({(got - eager).abs().max().item():.3g})"
        return None
    o = oracle.to(got.dtype) if got.dtype != torch.float32 else oracle
    try:
        assert_as_close_as_eager(got.float(), eager.float(), o, what, rounded_to=got.dtype)
    except AssertionError as e:
        return str(e)
    return None


def _compare(c: Case, label: str, got, want, oracle) -> str | None:
    """A lookup's forward is eager's bit for bit; sums (the gradient, `put`'s forward) are as
    close to the float64 oracle as eager's."""
    for n, (x, x_e) in enumerate(zip(got, want)):
        what = f"{label}: {'forward' if n == 0 else 'table gradient'}"
        if x_e is None:
            continue
        if x is None or x.shape != x_e.shape or x.dtype != x_e.dtype:
            return f"{what}: {None if x is None else (tuple(x.shape), x.dtype)}, eager " \
                   f"{(tuple(x_e.shape), x_e.dtype)}"
        if n == 0 and c.put == "none" and c.post not in INEXACT:
            if not torch.equal(x, x_e):
                diff = (x.double() - x_e.double()).abs().max().item()
                return f"{what} differs from eager's (max {diff:.3g})"
            continue
        failure = _close(x, x_e, oracle[n], what)
        if failure:
            return failure
    return None


def _caused_by(err: BaseException, kind) -> bool:
    """`err` or an exception it was raised from is a `kind`: the TorchScript runner reports
    any node's failure as a RunnerError naming the node, raised from the kernel's IndexError
    (eager's own ops run by the runner too, their errors the context of its own)."""
    while err is not None:
        if isinstance(err, kind):
            return True
        err = err.__cause__ or err.__context__
    return False


def _judge(c: Case, label: str, run_pf, run_eager, run_oracle) -> str | None:
    want, err_e = _outcome(run_eager)
    got, err = _outcome(run_pf)
    if err_e is not None:
        if err is None:
            return f"{label}: eager raised {type(err_e).__name__} ({err_e}), pyfuser returned " \
                   f"a result of shape {tuple(got[0].shape)}"
        if isinstance(err_e, IndexError) and not _caused_by(err, IndexError):
            return f"{label}: eager raised IndexError, pyfuser {type(err).__name__}: {err}"
        return None
    if err is not None:
        return f"{label}: eager returned, pyfuser raised {type(err).__name__}: {err}"
    return _compare(c, label, got, want, run_oracle())


def _check_compiled(c: Case) -> str | None:
    import pyfuser
    gen = torch.Generator().manual_seed(c.seed)
    sizes = [(c.shape, c.index_shapes)] + ([(c.shape2, c.index_shapes2)] if c.dynamic else [])
    fn = impl = None
    for n, (shape, index_shapes) in enumerate(sizes):
        base, view = _leaf_and_view(c, shape, gen)    # (the views of dynamic cases: any size)
        idx = _indices(c, shape, index_shapes, gen)
        v = _values(c, shape, index_shapes, gen)
        if fn is None:
            fn = program(c, view)
            impl = torch.compile(fn, backend="pyfuser", dynamic=True) if c.dynamic else \
                pyfuser.compile(fn)
        grad = c.grad and c.bad is None
        with torch.set_grad_enabled(grad):
            failure = _judge(
                c, f"compiled size {n}",
                lambda: _run(impl, c, view, base, c.dtype, idx, grad, v),
                lambda: _run(fn, c, view, base, c.dtype, idx, grad, v),
                lambda: _run(fn, c, view, base.to(c.dtype), torch.float64, idx, grad,
                             None if v is None else v.to(c.dtype)))
        if failure:
            return failure
    return None


def _check_traced(c: Case) -> str | None:
    import pyfuser
    gen = torch.Generator().manual_seed(c.seed)
    base, view = _leaf_and_view(c, c.shape, gen)
    idx = _indices(c, c.shape, c.index_shapes, gen)
    lookup = program(c, view)

    def fn(t, *idx):
        return lookup(t, None, *idx)
    t = base.to(c.dtype)
    t = t if c.view_inside else view(t)
    # traced on valid indices (zeros): after an exception inside torch.jit.trace, the next trace
    # of a 0-dim index may crash the process (torch's own: tracing an out-of-range
    # `(t + 1)[i - 3]`, then `t.transpose(0, 1)[i, j]`, segfaults without pyfuser)
    if any(n == 0 and i.numel() for i, n in zip(idx, c.shape)):
        return None
    good = [torch.zeros_like(i) for i in idx]
    with torch.no_grad():
        traced = _outcome(lambda: torch.jit.trace(fn, (t, *good), check_trace=False))
        if traced[1] is not None:
            return None                       # eager itself cannot be traced on this case
        f = pyfuser.jit(traced[0], cpu_executor="interpret")
        failure = _judge(c, "traced", lambda: (f(t, *idx), None), lambda: (fn(t, *idx), None),
                         lambda: (fn(t.double(), *idx), None))
        if failure:
            return failure
        run = getattr(f, "last_run", None)
        if c.k == 1 and c.index_op == "none" and c.bad is None and run is not None and \
                c.shape[0] > 0:
            left = [fb for fb in run.fallbacks if fb["kind"] == "aten::index"]
            if left:
                return f"traced: one first-axis index left out of the groups: {left}"
    return None


def check(c: Case) -> str | None:
    from pyfuser.frontend.fx import reset_compiled
    torch._dynamo.reset()
    reset_compiled()
    try:
        failure = _check_traced(c) if c.traced else _check_compiled(c)
        if not c.traced:
            c.notes = _fused_notes()
    except Exception as e:                  # noqa: BLE001  (the checker's own crash is a finding)
        import traceback
        failure = f"checker crashed: {type(e).__name__}: {e}\n{traceback.format_exc()}"
    finally:
        torch._dynamo.reset()
    return None if failure is None else f"seed {c.seed}: {failure}\n  {c}"


def _fused_notes() -> list:
    """What became of the index ops in the graphs compiled: "index fused", "index_put fused",
    or "<node>: <reason>" for one left to eager."""
    from pyfuser.frontend.fx import compiled_graphs
    notes = set()
    for g in compiled_graphs():
        ops = {op for r in g.regions for op in r.ops}
        notes |= {f"{op.split('.')[1]} fused" for op in ops
                  if op in ("aten.index.Tensor", "aten.index_put.default")}
        notes |= {f"{k.rstrip('_0123456789')}: {r}" for k, r in g.unsupported.items()
                  if k.startswith("index")}
    return sorted(notes)


def run_many(seeds):
    for s in seeds:
        c = case(s)
        yield c, check(c)


if __name__ == "__main__":
    import logging
    import os
    import time
    import warnings
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    warnings.filterwarnings("ignore")
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)   # AOTAutograd's 0-dim index
    start, count = int(sys.argv[1]), int(sys.argv[2])
    t0, failing, notes = time.time(), [], {}
    for c, f in run_many(range(start, start + count)):
        for n in c.notes:
            notes[n] = notes.get(n, 0) + 1
        if f:
            failing.append(c.seed)
            print(f, flush=True)
    for n, k in sorted(notes.items(), key=lambda x: -x[1]):
        print(f"{k:5d}  {n}")
    print(f"{count} cases, {len(failing)} failing {failing}, {time.time() - t0:.0f} s")
