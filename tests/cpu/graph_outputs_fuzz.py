"""Random call sequences of graphed torch.compile inference calls (`mode="reduce-overhead"`)
against eager PyTorch, to test how a replay hands out the graph's own output memory
(frontend/fx/cuda_graph_outputs.py's SharedOutputs, cuda_graphs.py's GraphedInference) on the
CPU, with tests/cpu/fake_graphs.py's stand-in for CUDA graphs.

A case is a small function of one or two float32 inputs (a chain of pointwise ops, the two
inputs mixed) returning one tensor or a tuple of 1-3 results: the chain's result, views of it
(`y[1:]`, `y.t()`, `y[:, :2]`, zero-size ones where a shape has one row), a sum / mean over a
dim, another pointwise result, the same tensor twice, a view of the input, a python scalar or
None; compiled with `dynamic` True or False, and run for 6-15 calls on random inputs, some of
new shapes (new signatures, recompiles), with MAX_GRAPHS sometimes 1 or 2 (evictions). After
each call the driver keeps the result, drops it (and all it held but clones), keeps a view of
one output, keeps clones, or feeds an output back as the next call's input (keeping or
dropping the rest).

The stand-in (`Poisoning`: FakeGraphs with `poison`) makes a read of an invalidated storage
show: it fills its memory with NaNs (a CUDA build's makes reading it raise) and keeps it alive
(so that its address, by which `is_invalid` knows it, is not reused). Checked after every call
and at the end:
- no exception; every result equals eager's result of the same inputs (computed before the
  call, on copies): a call that read an input invalidated under it reads NaNs;
- every tensor the driver holds is either invalidated or equal to the eager result of the call
  that produced it; clones are never invalidated;
- a call made while the driver holds nothing handed out (all earlier outputs dropped, no output
  fed back) invalidates nothing;
- at the end, with the compiled function and its graphs collected, every held tensor on the
  graph's memory (an alias of an output storage) is invalidated.

`case(i)` is reproducible from the seed alone; `check(i)` returns None or a one-line failure;
`python tests/cpu/graph_outputs_fuzz.py START COUNT` is the long run.
"""
from __future__ import annotations

import gc
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

os.environ.setdefault("PYFUSER_INTERP_RACECHECK", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pyfuser  # noqa: E402
from fake_graphs import FakeGraphs  # noqa: E402
from pyfuser.frontend.fx import cuda_graphs as CG  # noqa: E402
from pyfuser.frontend.fx import reset_compiled  # noqa: E402

PRE = ["sin", "tanh", "relu", "sigmoid", "mul", "add", "sq", "exp", "mix_add", "mix_mul"]
OUTS = ["y", "y", "y1", "yt", "yc", "sum0", "sum1", "mean1", "z", "twice", "xview", "scalar",
        "none"]
ACTIONS = ["keep", "drop", "view", "clone", "feed"]


@dataclass
class Case:
    seed: int
    inputs: int                  # 1 or 2 tensor arguments (of one shape)
    pre: list                    # pointwise ops of the chain y
    outs: list                   # what the function returns (OUTS)
    bare: bool                   # one output returned as a bare tensor
    dynamic: bool
    max_graphs: int              # 0: CG.MAX_GRAPHS as it is
    shapes: list                 # the shapes calls draw from
    calls: list = field(default_factory=list)   # (shape index, action, output index, keep rest)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.__dict__.items())


def case(seed: int) -> Case:
    r = random.Random(seed)
    outs = [r.choice(OUTS) for _ in range(r.randint(1, 3))]
    if all(o in ("scalar", "none") for o in outs):
        outs[0] = "y"
    shapes = [(r.randint(1, 5), r.randint(1, 6)) for _ in range(r.randint(1, 3))]
    calls = []
    for _ in range(r.randint(6, 15)):
        shape = 0 if r.random() < 0.5 else r.randrange(len(shapes))
        calls.append((shape, r.choice(ACTIONS), r.randrange(len(outs)), r.random() < 0.5))
    return Case(seed, r.randint(1, 2), [r.choice(PRE) for _ in range(r.randint(1, 3))], outs,
                len(outs) == 1 and r.random() < 0.5, r.random() < 0.5,
                r.choice([0, 0, 1, 2]), shapes, calls)


def build(c: Case):
    """The case's function (eager; compiled by the driver)."""
    def pre(op, y, xs):
        if op == "sin":
            return torch.sin(y)
        if op == "tanh":
            return torch.tanh(y)
        if op == "relu":
            return torch.relu(y)
        if op == "sigmoid":
            return torch.sigmoid(y)
        if op == "mul":
            return y * 1.5
        if op == "add":
            return y + 0.25
        if op == "sq":
            return y * y
        if op == "exp":
            return torch.exp(y * 0.5)
        if op == "mix_add":
            return y + xs[-1]
        return y * xs[-1]

    def out(kind, y, xs):
        if kind == "y":
            return y
        if kind == "y1":
            return y[1:]
        if kind == "yt":
            return y.t()
        if kind == "yc":
            return y[:, :2]
        if kind == "sum0":
            return y.sum(0)
        if kind == "sum1":
            return y.sum(1)
        if kind == "mean1":
            return y.mean(1)
        if kind == "z":
            return y * 2 + xs[0]
        if kind == "twice":
            return y
        if kind == "xview":
            return xs[0][1:]
        if kind == "scalar":
            return 3
        return None

    def f(*xs):
        y = xs[0]
        for op in c.pre:
            y = pre(op, y, xs)
        res = []
        for kind in c.outs:
            res.append(out(kind, y, xs))
            if kind == "twice":
                res.append(y)
        return res[0] if c.bare else tuple(res)
    return f


def Poisoning():
    """The stand-in: invalidated storages read NaNs and stay alive (FakeGraphs's `poison`)."""
    return FakeGraphs(invalidates=True, poison=True)


def _tensors(res) -> list:
    return [t for t in (res if isinstance(res, tuple) else (res,)) if isinstance(t, torch.Tensor)]


def _same(got, want, what: str):
    """None, or why `got` (a result) is not `want`."""
    if isinstance(want, torch.Tensor) != isinstance(got, torch.Tensor):
        return f"{what}: {type(got).__name__} for {type(want).__name__}"
    if not isinstance(want, torch.Tensor):
        return None if got == want else f"{what}: {got!r} for {want!r}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{what}: shape {tuple(got.shape)} {got.dtype} for {tuple(want.shape)}"
    try:
        torch.testing.assert_close(got, want, equal_nan=True)
    except AssertionError as ex:
        return f"{what}: values differ ({str(ex).splitlines()[-1].strip()})"
    return None


def run(seed: int):
    """(None or a one-line failure, notes: what the case exercised)."""
    c = case(seed)
    notes = Counter()
    g = Poisoning()
    saved = (CG.Backend, CG.MAX_GRAPHS)
    CG.Backend = lambda: g
    if c.max_graphs:
        CG.MAX_GRAPHS = c.max_graphs
    torch._dynamo.reset()
    reset_compiled()
    CG._LIVE.clear()
    try:
        with torch.no_grad():
            return _drive(c, g, notes), notes
    except Exception as ex:  # noqa: BLE001 - any exception is the case's failure
        return f"seed {seed}: {type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}" \
               f" | {c.describe()}", notes
    finally:
        CG.Backend, CG.MAX_GRAPHS = saved
        torch._dynamo.reset()
        CG._LIVE.clear()


def _drive(c: Case, g: FakeGraphs, notes: Counter):
    f = build(c)
    compiled = torch.compile(f, backend=pyfuser.backend, mode="reduce-overhead",
                             dynamic=c.dynamic)
    gen = torch.Generator().manual_seed(c.seed)
    held: list = []              # (tensor, eager value, clone?, what, on a graph's memory?)
    fed = None                   # (tensor, eager value, on a graph's memory?): the next input
    for n, (shape_i, action, k, keep_rest) in enumerate(c.calls):
        shape = c.shapes[shape_i]
        if fed is not None:
            x, shape = fed[0], tuple(fed[0].shape)
        else:
            x = torch.randn(shape, generator=gen)
        xs = [x] + [torch.randn(shape, generator=gen) for _ in range(c.inputs - 1)]
        want = f(*[t.clone() for t in xs])
        holding = fed is not None or any(not h[2] for h in held)
        invalid_before = len(g.invalid)
        got = compiled(*xs)
        what = f"seed {c.seed} call {n}"
        if not holding and len(g.invalid) != invalid_before:
            return f"{what}: invalidated {len(g.invalid) - invalid_before} storages while the " \
                   f"driver held nothing handed out | {c.describe()}"
        why = _compare(c, got, want, what)
        if why:
            return f"{why} | {c.describe()}"
        if fed is not None:
            held.append((fed[0], fed[1], False, f"the input of call {n}", fed[2]))
        del xs, x
        notes[action] += 1
        kept, fed = _after(got, want, action, k, keep_rest, n)
        held += kept
        notes["fed back"] += fed is not None
        del got, want, kept
        # outputs the driver let go are gone by now; what it holds is checked
        why = _check_held(g, held, what)
        if why:
            return f"{why} | {c.describe()}"
        if action == "drop":
            held = [h for h in held if h[2]]          # let go of everything but the clones
    _count(notes)
    if fed is not None:
        held.append((fed[0], fed[1], False, "the output fed to no call", fed[2]))
    why = _check_held(g, held, f"seed {c.seed} after the calls")
    if why:
        return f"{why} | {c.describe()}"
    # the compiled function and its graphs go: what is held on their memory is invalidated
    del compiled, f
    CG._LIVE.clear()
    torch._dynamo.reset()
    gc.collect()
    for t, _, _, name, on_graph in held:
        if on_graph and not g.is_invalid(t):
            return f"seed {c.seed} at the end: {name} is on a dropped graph's memory and was " \
                   f"not invalidated | {c.describe()}"
    notes["held at the end"] += len(held)
    return None


def _compare(c: Case, got, want, what: str):
    """None, or why a call's result is not eager's (its own frame: no name outlives it)."""
    if c.bare:
        got, want = (got,), (want,)
    if len(got) != len(want):
        return f"{what}: {len(got)} results for {len(want)}"
    for i, (o, w) in enumerate(zip(got, want)):
        why = _same(o, w, f"{what} output {i}")
        if why:
            return why
    return None


def _after(got, want, action: str, k: int, keep_rest: bool, n: int):
    """What the driver holds of a call's result after `action`: ([(tensor, eager value, clone?,
    what)], the output fed to the next call as (tensor, eager value) or None)."""
    shared = _aliases()
    outs = [(o, w, o.untyped_storage()._cdata in shared)
            for o, w in zip(_tensors(got), _tensors(want))]
    kept, fed = [], None
    if action == "keep" or (action == "feed" and keep_rest):
        kept = [(o, w, False, f"output {i} of call {n}", a) for i, (o, w, a) in enumerate(outs)]
    elif action == "view":
        cand = [h for h in outs if h[0].numel()]
        if cand:
            o, w, a = cand[k % len(cand)]
            kept = [(o[1:], w[1:], False, f"a view of an output of call {n}", a)]
    elif action == "clone":
        kept = [(o.clone(), w, True, f"a clone of output {i} of call {n}", False)
                for i, (o, w, _) in enumerate(outs)]
    if action == "feed":
        cand = [h for h in outs if h[0].dim() == 2]
        if cand:
            fed = cand[k % len(cand)]
    return kept, fed


def _aliases() -> set:
    """The storages (StorageImpl addresses) the graphed calls hand out now."""
    return {a._cdata for gi in CG.graphed_calls() for e in gi.entries.values()
            if e.hand is not None for a in e.hand.aliases}


def _count(notes: Counter) -> None:
    """The graphed calls' counts into `notes` (its own frame: no reference to them outlives
    it, so that they can be collected at the end)."""
    for gi in CG.graphed_calls():
        notes["replays"] += gi.replays
        notes["captures"] += gi.captures
        notes["stale"] += gi.stale
        notes["signatures given up"] += sum(e.failed is not None for e in gi.entries.values())


def _check_held(g: FakeGraphs, held: list, what: str):
    for t, w, clone, name, _ in held:
        if g.is_invalid(t):
            if clone:
                return f"{what}: {name} was invalidated"
            continue
        why = _same(t, w, f"{what}: {name}")
        if why:
            return why
    return None


def check(seed: int) -> str | None:
    return run(seed)[0]


def main(start: int, count: int) -> None:
    """Run cases start..start+count-1; print failures and what the cases exercised."""
    import logging
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    seen, fails, t0 = Counter(), 0, time.time()
    for s in range(start, start + count):
        why, notes = run(s)
        seen.update(notes)
        seen["cases with evictions"] += case(s).max_graphs > 0
        if why:
            fails += 1
            print("FAIL", why, flush=True)
    print(f"{count} cases, {fails} failures, {time.time() - t0:.0f} s")
    for note, n in seen.most_common():
        print(f"{n:7d}  {note}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
