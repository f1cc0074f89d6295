"""Models through torch.compile: eager, Inductor and pyfuser, forward and training step, one run.

    PYTHONPATH=. python3 bench/models.py                        # GPU: everything the budget allows
    PYTHONPATH=. python3 bench/models.py --models bert,resnet18 --dtypes bfloat16 --modes eager,pyfuser
    PYTHONPATH=. python3 bench/models.py --no-compile-times     # timings only (no warm compile)
    PYTHONPATH=. python3 bench/models.py --dry-run              # CPU: small sizes, every step checked

Models (tests/cpu/train_corpus.py, random weights, never a download): HF BERT (masked LM), GPT-2
and Llama (causal LM) at batch 8 x 512 tokens, hidden 768, 4 layers, 12 heads (`--size`
batch,seq,hidden,layers), and a ResNet-18 (batch 8, 224 x 224, train mode: batch norm with
running statistics); each in float32 and under bfloat16 autocast. Modes: `eager`, `inductor`
(torch.compile's default backend) and `pyfuser` (torch.compile(backend="pyfuser")); on request
(`--modes`) `inductor-cg` and `pyfuser-cg`, the same with mode="reduce-overhead" (CUDA graphs
for inference, forward and backward graphs in both; a graph drawing random numbers, dropout's,
is not graphed by pyfuser). Columns:
- `fwd_ms`: an inference forward (eval mode, torch.no_grad()); `train_ms`: a training step
  (train mode with the configs' own dropout, `--dropout` to override; the loss, backward and an
  SGD step, the optimizer eager in every mode). Median of `--reps` calls timed by CUDA events
  (wall clock on the CPU), after warm-up calls; with `--rounds R` the modes of a model and dtype
  are then timed again interleaved (bench/models_timing.py) and those medians are the columns;
- `fwd_kernels`, `train_kernels`: CUDA kernels one call launches (torch.profiler; memcpy and
  memset not counted);
- `cold_s`: the first forward plus the first training step (Dynamo, AOTAutograd, the backend's
  compilation, the first runs) with empty caches: every compile cache directory (Inductor's,
  Triton's, pyfuser's PYFUSER_CACHE_DIR) a fresh one for this row and every in-memory cache of
  both compilers emptied (both compilers were warmed up on a tiny function first, so imports
  and worker pools are not counted);
- `warm_s`: the same again after emptying the in-memory caches and torch._dynamo.reset(), the
  disk caches kept: what a new process pays with a warm disk cache (pyfuser: CUBINs and the
  regions' plans, docs/compile_backend.md; Inductor: its FX graph, AOTAutograd and Triton
  caches) (`--warm-dtypes`, default float32 rows only: it doubles a row's compile time).
  Inductor's compile workers keep the Triton cache directory they started with, so its cold
  rows may find Triton kernels an earlier row compiled (its FX graph cache is fresh);
- `trace_s`, `trace_warm_s`: the same first calls, cold and again, through torch.compile's
  `aot_eager` backend: Dynamo, AOTAutograd's tracing and eager runs, no backend compilation;
  what both backends' `cold_s` / `warm_s` include besides their own work. The compile-time
  summary after the table compares pyfuser's with Inductor's both ways: whole (`cold_s`,
  `warm_s`, the issue's targets: 1/3 and 1/10) and the backend's own share (minus `trace_s` /
  `trace_warm_s`; Inductor's own share includes its decompositions' tracing, and a warm
  Inductor may skip AOTAutograd's tracing through its AOTAutograd cache). `--no-trace-baseline`
  skips it;
- `check`: the compiled forward's largest error relative to eager's largest logit, and the
  first training loss next to eager's (their dropout masks differ); `error` marks a result off
  eager by more than float tolerance, or the exception a row ended with;
- `regions`: pyfuser's fused regions per graph it compiled (i inference, f forward, b backward;
  several f / b: Dynamo graph breaks, which come from the model's code).
Output (bench/models_report.py): a markdown table and pyfuser / Inductor ratios on stdout;
under `--out` (default $OUT) `bench_models.md`, `bench_models.json` (rows and run facts) and
`bench_models_speed.svg` (speed relative to eager per model, dtype and step; bench/plot.py), the
first two rewritten after each row. Float32 rows come first; new rows stop starting after `--budget`
seconds (default 270); the rows not run say so.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from bench.models_report import report, write_outputs  # noqa: E402
from bench.models_timing import interleaved_times, sync, time_ms  # noqa: E402

MODELS = ("bert", "gpt2", "llama", "resnet18")
DTYPES = ("float32", "bfloat16")
MODES = ("eager", "inductor", "pyfuser", "inductor-cg", "pyfuser-cg")
DEFAULT_MODES = MODES[:3]
CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "PYFUSER_CACHE_DIR")


def load_corpus():
    """tests/cpu/train_corpus.py (the models of the training tests), loaded by path."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from common import load_test_module
    return load_test_module("train_corpus")


def profile_size(TC, device: str, text: str = ""):
    """The size tools/profile_*.py run a model at: `text` ("batch,seq,hidden,layers"; heads =
    hidden / 64) when given, else the benchmark's on CUDA and one layer of the small CPU size."""
    size = TC.BENCH if device == "cuda" else dataclasses.replace(TC.SMALL, layers=1)
    if text:
        b, q, h, n = (int(x) for x in text.split(","))
        size = dataclasses.replace(size, batch=b, seq=q, hidden=h, layers=n, heads=max(1, h // 64))
    return size


# ---- caches --------------------------------------------------------------------------------------
def fresh_cache_dirs(base: str, tag: str) -> None:
    """Point every compile cache at new, empty directories under `base`."""
    d = tempfile.mkdtemp(prefix=f"{tag}_", dir=base)
    for var in CACHE_VARS:
        os.environ[var] = os.path.join(d, var.split("_")[0].lower())


def clear_in_memory() -> None:
    """Forget what both compilers hold in memory (the disk caches stay)."""
    import torch
    torch._dynamo.reset()
    from pyfuser.frontend.fx.compile_graph import clear_cache
    from pyfuser.runtime import dispatch
    clear_cache()
    dispatch.clear_caches()
    try:
        import torch._inductor.utils as iu
        clear = getattr(iu, "clear_caches", None) or getattr(iu, "clear_inductor_caches", None)
        if clear is not None:
            clear()
        from torch._inductor.codecache import PyCodeCache
        PyCodeCache.cache_clear()
    except Exception:  # noqa: BLE001 - best effort across torch versions (no Inductor on CPU runs)
        pass


def warm_up_compilers(modes, device: str, base: str) -> None:
    """Compile a tiny function with each compiler (in a throwaway cache) so that the first row's
    cold compile does not pay for imports and worker pools."""
    fresh_cache_dirs(base, "warmup")
    for mode in modes:
        if mode != "eager":
            compile_tiny(mode, device)
    clear_in_memory()


def compile_tiny(mode: str, device: str) -> None:
    """A tiny function compiled with `mode`'s backend and called with gradients and without
    (a forward, a backward, an inference forward): the imports, worker pools and first-use
    costs of a compiler, paid before a model's first call is timed."""
    import torch
    x = torch.randn(64, 64, device=device, requires_grad=True)
    fn = torch.compile(lambda t: torch.nn.functional.gelu(t * 2).sum(-1), backend=_backend(mode))
    fn(x).sum().backward()
    with torch.no_grad():
        fn(x)


def _backend(mode: str):
    mode = mode.removesuffix("-cg")
    if mode in ("inductor", "aot_eager"):
        return mode
    import pyfuser                 # installed, backend="pyfuser" names the same (entry point)
    return pyfuser.backend


# ---- one model in one dtype ----------------------------------------------------------------------
class Case:
    """A model of the corpus in one dtype: fresh copies per mode, its inputs, its two steps."""

    def __init__(self, TC, name: str, dtype: str, size, device: str, dropout):
        import torch
        self.torch, self.device, self.name = torch, device, name
        self.autocast = dtype == "bfloat16"
        if name == "resnet18" and device == "cuda":
            size = dataclasses.replace(size, seq=224)
        self.base = TC.TRAIN_CASES[name](device, size, dropout=dropout)
        self.inputs = self.base.inputs
        self.fwd_inputs = {k: v for k, v in self.inputs.items() if k != "labels"}

    def _ctx(self):
        if not self.autocast:
            return contextlib.nullcontext()
        return self.torch.autocast(self.device, dtype=self.torch.bfloat16)

    def make(self, mode: str):
        model = copy.deepcopy(self.base.model)
        extra = {"mode": "reduce-overhead"} if mode.endswith("-cg") else {}
        fn = model if mode == "eager" else self.torch.compile(model, backend=_backend(mode),
                                                              **extra)
        return model, fn, self.torch.optim.SGD(model.parameters(), lr=1e-4)

    def forward(self, model, fn):
        if model.training:                  # a module-tree walk: not part of a timed forward
            model.eval()
        with self.torch.no_grad(), self._ctx():
            return fn(**self.fwd_inputs)

    def train_step(self, model, fn, opt):
        if not model.training:
            model.train()
        opt.zero_grad(set_to_none=True)
        with self._ctx():
            loss = self.base.loss(fn(**self.inputs))
        loss.backward()
        opt.step()
        return loss.detach()


def _logits(out):
    if hasattr(out, "logits"):
        return out.logits
    return out if not isinstance(out, (tuple, list)) else out[0]


def _first_calls(case, mode) -> tuple:
    """(seconds, model, fn, opt, forward output, first loss) of a new compile of `mode`."""
    model, fn, opt = case.make(mode)
    t0 = time.perf_counter()
    # a copy: a CUDA-graph mode's output buffers are rewritten by the next call (Inductor's
    # CUDA-graph trees refuse a read of an overwritten output)
    fwd = _logits(case.forward(model, fn)).float().clone()
    loss = case.train_step(model, fn, opt)
    sync(case.device)
    return time.perf_counter() - t0, model, fn, opt, fwd, loss


def trace_times(case, args, key, base_dir) -> dict:
    """{"trace_s", "trace_warm_s"}: the first calls through the `aot_eager` backend (Dynamo and
    AOTAutograd, no compiler), cold and again after torch._dynamo.reset(); once per model and
    dtype (`key`), shared by the Inductor and pyfuser rows."""
    done = args.trace_cache.get(key)
    if done is None:
        fresh_cache_dirs(base_dir, "trace")
        clear_in_memory()
        done = {"trace_s": _first_calls(case, "aot_eager")[0]}
        if case_dtype_warm(args, key[1]):
            clear_in_memory()
            done["trace_warm_s"] = _first_calls(case, "aot_eager")[0]
        args.trace_cache[key] = done
    return dict(done)


def case_dtype_warm(args, dtype: str) -> bool:
    return args.compile_times and dtype in args.warm_dtypes


def run_case(TC, args, name, dtype, mode, size, device, base_dir) -> dict:
    row = {"model": name, "dtype": dtype, "mode": mode}
    case = Case(TC, name, dtype, size, device, args.dropout)
    from pyfuser.frontend.fx import compiled_graphs
    n_graphs = len(compiled_graphs())
    if mode != "eager" and args.trace_baseline:
        row.update(trace_times(case, args, (name, dtype), base_dir))
    if mode != "eager":
        fresh_cache_dirs(base_dir, f"{name}_{dtype}_{mode}")
        clear_in_memory()
    cold, model, fn, opt, fwd, loss = _first_calls(case, mode)
    if mode != "eager":
        row["cold_s"] = cold
    # correctness: the eval forward and the first training loss against eager's
    ref_model, ref_fn, ref_opt = case.make("eager")
    want = case.forward(ref_model, ref_fn)
    got, exp = _logits(fwd).float(), _logits(want).float()
    rel = ((got - exp).abs().max() / exp.abs().max().clamp_min(1e-6)).item()
    ref_loss = case.train_step(ref_model, ref_fn, ref_opt)
    row["check"] = f"fwd {rel:.1e}, loss {loss.item():.4f}/{ref_loss.item():.4f}"
    tol = 5e-2 if dtype == "bfloat16" else 5e-3
    if not (rel < tol and abs(loss.item() - ref_loss.item()) < 0.05 * abs(ref_loss.item())):
        row["error"] = "differs from eager"
    del ref_model, ref_fn, ref_opt
    row["fwd_ms"] = time_ms(lambda: case.forward(model, fn), device, args.reps, args.warmup)
    row["train_ms"] = time_ms(lambda: case.train_step(model, fn, opt), device, args.reps,
                              args.warmup)
    if device == "cuda":
        from bench.common import count_kernels
        row["fwd_kernels"] = count_kernels(lambda: case.forward(model, fn))
        row["train_kernels"] = count_kernels(lambda: case.train_step(model, fn, opt))
    if mode.startswith("pyfuser"):
        graphs = compiled_graphs()[n_graphs:]
        row["regions"] = "+".join(f"{len(g.regions)}{g.kind[0]}" for g in graphs)
    del model, fn, opt
    if mode != "eager" and case_dtype_warm(args, dtype):
        clear_in_memory()
        row["warm_s"] = _first_calls(case, mode)[0]
    return row


# ---- main ----------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"of {','.join(MODES)} (-cg: mode=\"reduce-overhead\", CUDA graphs)")
    p.add_argument("--size", default="", help="batch,seq,hidden,layers (default 8,512,768,4)")
    p.add_argument("--dropout", type=float, default=None,
                   help="every dropout probability of the HF configs (default: their own)")
    p.add_argument("--reps", type=int, default=None, help="timed calls (default 20, CPU 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 3, CPU 1)")
    p.add_argument("--no-compile-times", dest="compile_times", action="store_false",
                   help="skip the warm compile")
    p.add_argument("--no-trace-baseline", dest="trace_baseline", action="store_false",
                   help="skip the aot_eager baseline (trace_s, trace_warm_s)")
    p.add_argument("--warm-dtypes", default="float32",
                   help="dtypes whose rows measure the warm compile too (default float32)")
    p.add_argument("--dry-run", action="store_true",
                   help="on the CPU (kernel interpreter), small sizes, float32, no Inductor")
    p.add_argument("--rounds", type=int, default=0,
                   help="time the modes of each model and dtype again interleaved, in this many "
                        "rounds (bench/models_timing.py); fwd_ms / train_ms then come from there")
    p.add_argument("--budget", type=float, default=270.0, help="seconds; no new case after")
    p.add_argument("--out", default=os.environ.get("OUT"), help="output directory (default $OUT)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    TC = load_corpus()
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    size = TC.BENCH if device == "cuda" else TC.SMALL
    if args.size:
        b, s, h, n = (int(v) for v in args.size.split(","))
        size = dataclasses.replace(size, batch=b, seq=s, hidden=h, layers=n)
    args.reps = args.reps or (20 if device == "cuda" else 2)
    args.warmup = args.warmup if args.warmup is not None else (3 if device == "cuda" else 1)
    args.warm_dtypes = set(args.warm_dtypes.split(","))
    args.trace_cache = {}
    modes = [m for m in args.modes.split(",") if m]
    dtypes = [d for d in args.dtypes.split(",") if d]
    bad = [x for x in modes if x not in MODES] + [x for x in dtypes if x not in DTYPES]
    if bad:
        raise SystemExit(f"bench/models.py: unknown mode or dtype {bad}")
    if device == "cpu":       # Inductor's CPU code and bf16 on the interpreter: not this benchmark
        modes = [m for m in modes if not m.startswith("inductor")]
        dtypes = [d for d in dtypes if d != "bfloat16"]
    base_dir = tempfile.mkdtemp(prefix="bench_models_")
    if device == "cuda":
        from pyfuser.runtime import native
        native.build()                 # an install step (make setup): loaded before any row
    warm_up_compilers(modes, device, base_dir)
    start, rows = time.perf_counter(), []
    for dtype in dtypes:
        for name in filter(None, args.models.split(",")):
            for mode in modes:
                if time.perf_counter() - start > args.budget:
                    rows.append({"model": name, "dtype": dtype, "mode": mode,
                                 "error": "not run: time budget"})
                    continue
                try:
                    rows.append(run_case(TC, args, name, dtype, mode, size, device, base_dir))
                except Exception as e:  # noqa: BLE001 - a failure is a row, not the end
                    traceback.print_exc()
                    rows.append({"model": name, "dtype": dtype, "mode": mode,
                                 "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                                 if str(e) else type(e).__name__})
                print(rows[-1], flush=True)
                if args.out:           # as it goes: a run stopped from outside keeps its rows
                    text, facts = report(rows, args, size, device, start)
                    write_outputs(args.out, text, rows, facts, with_plot=False)
            if args.rounds > 0:
                _interleave(TC, args, [r for r in rows if (r["model"], r["dtype"]) ==
                                       (name, dtype)], size, device)
    text, facts = report(rows, args, size, device, start)
    print(text)
    if args.out:
        for path in write_outputs(args.out, text, rows, facts):
            print("wrote", path)
    return 1 if any("error" in r for r in rows) else 0


def _interleave(TC, args, case_rows, size, device) -> None:
    """Replace the rows' fwd_ms / train_ms by the interleaved timing (the blocked medians kept
    as fwd_ms_block / train_ms_block, the rounds' spread as fwd_spread / train_spread)."""
    ok = [r for r in case_rows if "error" not in r and "fwd_ms" in r]
    if len(ok) < 2:
        return
    r0 = ok[0]
    case = Case(TC, r0["model"], r0["dtype"], size, device, args.dropout)
    try:
        got = interleaved_times(case, [r["mode"] for r in ok], args.rounds, args.reps, device)
    except Exception as e:  # noqa: BLE001 - the blocked times stay, with the reason
        traceback.print_exc()
        for r in ok:
            r["rounds_error"] = f"{type(e).__name__}: {str(e)[:120]}"
        return
    for r in ok:
        for step in ("fwd", "train"):
            r[f"{step}_ms_block"] = r[f"{step}_ms"]
            r[f"{step}_ms"] = got[r["mode"]][f"{step}_ms"]
            r[f"{step}_spread"] = got[r["mode"]][f"{step}_spread"]


if __name__ == "__main__":
    sys.exit(main())
