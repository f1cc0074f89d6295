"""Transformers through torch.compile: eager, Inductor and pyfuser, forward and training step.

    PYTHONPATH=. python3 bench/models.py                           # GPU: everything (< 9 min)
    PYTHONPATH=. python3 bench/models.py --models bert,gpt2 --dtypes bfloat16 --modes eager,pyfuser
    PYTHONPATH=. python3 bench/models.py --no-compile-times        # timings only
    PYTHONPATH=. python3 bench/models.py --dry-run                 # CPU: small sizes, checks only

Models: tests/cpu/train_corpus.py's HF BERT (masked LM), GPT-2 and Llama (causal LM), random
weights, batch 8 x 512 tokens, hidden 768, 4 layers, 12 heads (`--size` batch,seq,hidden,layers),
each in float32 and under bfloat16 autocast. For each model, dtype and mode (`eager`,
`inductor` = torch.compile's default backend, `pyfuser` = torch.compile(backend="pyfuser")):
- `fwd_ms`: an inference forward (eval mode, torch.no_grad()), median of CUDA-event timings;
- `train_ms`: a training step: forward in train mode (the configs' dropout, `--dropout` to
  override), the LM loss, backward and an SGD step (the optimizer eager in every mode);
- `fwd_kernels`, `train_kernels`: CUDA kernels one call launches (torch.profiler, memcpy and
  memset excluded);
- `cold_s`: the first forward plus the first training step (Dynamo, AOTAutograd, the backend's
  compilation), with empty caches: every cache directory (Inductor's, Triton's, pyfuser's) is a
  fresh temporary one unless `--keep-caches`;
- `warm_s`: the same after torch._dynamo.reset() and clearing the in-memory caches of both
  compilers (pyfuser's kernels, fusions and regions; Inductor's compiled modules), so that what
  is left is the disk caches: a new process's warm start, measured in this one;
- `check`: the compiled forward against eager's (eval mode: no dropout), max relative error,
  and the training loss against eager's (their dropout masks differ);
- `regions`: pyfuser's fused regions per graph it compiled (i inference, f forward, b backward;
  the warm compile's graphs not counted).
Results print as a markdown table (also to $OUT/bench_models.md when OUT is set); the run stops
starting new cases after `--budget` seconds (default 480).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "cpu"))


def _fresh_caches(keep: bool) -> None:
    """Point every compile cache at a new temporary directory (before torch is imported)."""
    if keep:
        return
    base = tempfile.mkdtemp(prefix="bench_models_")
    for var, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                     ("PYFUSER_CACHE_DIR", "pyfuser")):
        os.environ[var] = os.path.join(base, sub)


def _load_corpus():
    spec = importlib.util.spec_from_file_location(
        "train_corpus", os.path.join(ROOT, "tests", "cpu", "train_corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_corpus"] = mod
    spec.loader.exec_module(mod)
    return mod


MODELS = ("bert", "gpt2", "llama")
DTYPES = ("float32", "bfloat16")
MODES = ("eager", "inductor", "pyfuser")


def _time_ms(fn, device: str, reps: int = 10, warmup: int = 3) -> float:
    import torch
    for _ in range(warmup):
        fn()
    if device != "cuda":
        times = []
        for _ in range(max(2, reps // 4)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _kernels(fn) -> int:
    from bench.common import count_kernels
    return count_kernels(fn)


def _clear_in_memory(mode: str) -> None:
    import torch
    torch._dynamo.reset()
    if mode == "pyfuser":
        from pyfuser.frontend.fx.compile_graph import clear_cache
        from pyfuser.runtime import dispatch
        clear_cache()
        dispatch.clear_caches()
    elif mode == "inductor":
        try:
            from torch._inductor.codecache import PyCodeCache
            PyCodeCache.cache_clear()
        except Exception:  # noqa: BLE001 - best effort across torch versions
            pass


class Case:
    """One model in one dtype: its modules per mode, inputs, the step functions."""

    def __init__(self, TC, name, dtype, size, device, dropout):
        import torch
        self.TC, self.device = TC, device
        self.autocast = dtype == "bfloat16"
        base = TC.TRAIN_CASES[name](device, size, dropout=dropout)
        self.base = base
        self.inputs = base.inputs
        self.fwd_inputs = {k: v for k, v in base.inputs.items() if k != "labels"}
        self.torch = torch

    def _ctx(self):
        import contextlib
        return self.torch.autocast(self.device, dtype=self.torch.bfloat16) if self.autocast \
            else contextlib.nullcontext()

    def make(self, mode: str):
        model = copy.deepcopy(self.base.model)
        if mode == "eager":
            fn = model
        elif mode == "inductor":
            fn = self.torch.compile(model)
        else:
            import pyfuser          # the entry point names it "pyfuser" once pip-installed
            fn = self.torch.compile(model, backend=pyfuser.backend)
        opt = self.torch.optim.SGD(model.parameters(), lr=1e-4)
        return model, fn, opt

    def forward(self, model, fn):
        model.eval()
        with self.torch.no_grad(), self._ctx():
            return fn(**self.fwd_inputs)

    def train_step(self, model, fn, opt):
        model.train()
        opt.zero_grad(set_to_none=True)
        with self._ctx():
            out = fn(**self.inputs)
            loss = out.loss
        loss.backward()
        opt.step()
        return loss.detach()


def _logits(out):
    return out.logits if hasattr(out, "logits") else out[0]


def run_case(TC, name, dtype, mode, size, device, dropout, compile_times) -> dict:
    import torch
    row = {"model": name, "dtype": dtype, "mode": mode}
    case = Case(TC, name, dtype, size, device, dropout)
    n_graphs = _graph_count()
    model, fn, opt = case.make(mode)
    t0 = time.perf_counter()
    fwd = case.forward(model, fn)
    loss = case.train_step(model, fn, opt)
    if device == "cuda":
        torch.cuda.synchronize()
    row["cold_s"] = time.perf_counter() - t0
    # correctness: eval forward and the first training loss against eager's
    ref_model, ref_fn, ref_opt = case.make("eager")
    want = case.forward(ref_model, ref_fn)
    got, exp = _logits(fwd).float(), _logits(want).float()
    rel = ((got - exp).abs().max() / exp.abs().max().clamp_min(1e-6)).item()
    ref_loss = case.train_step(ref_model, ref_fn, ref_opt)
    row["check"] = f"fwd {rel:.1e}, loss {loss.item():.4f}/{ref_loss.item():.4f}"
    tol = 3e-2 if dtype == "bfloat16" else 2e-3
    if not (rel < tol and abs(loss.item() - ref_loss.item()) < 0.05 * abs(ref_loss.item())):
        row["error"] = "differs from eager"
    row["fwd_ms"] = _time_ms(lambda: case.forward(model, fn), device)
    row["train_ms"] = _time_ms(lambda: case.train_step(model, fn, opt), device)
    if device == "cuda":
        row["fwd_kernels"] = _kernels(lambda: case.forward(model, fn))
        row["train_kernels"] = _kernels(lambda: case.train_step(model, fn, opt))
    if mode == "pyfuser":
        from pyfuser.frontend.fx import compiled_graphs
        graphs = compiled_graphs()[n_graphs:]
        row["regions"] = "+".join(f"{len(g.regions)}{g.kind[0]}" for g in graphs)
    if compile_times and mode != "eager":
        _clear_in_memory(mode)
        model2, fn2, opt2 = case.make(mode)
        t0 = time.perf_counter()
        case.forward(model2, fn2)
        case.train_step(model2, fn2, opt2)
        if device == "cuda":
            torch.cuda.synchronize()
        row["warm_s"] = time.perf_counter() - t0
    if mode == "eager":
        row.pop("cold_s", None)
    return row


def _graph_count() -> int:
    try:
        from pyfuser.frontend.fx import compiled_graphs
        return len(compiled_graphs())
    except ImportError:
        return 0


def _fmt(v) -> str:
    if v is None:
        return ""
    return f"{v:.2f}" if isinstance(v, float) else str(v)


COLUMNS = ["model", "dtype", "mode", "fwd_ms", "train_ms", "fwd_kernels", "train_kernels",
           "cold_s", "warm_s", "regions", "check", "error"]


def table(rows) -> str:
    from bench.common import markdown
    used = [c for c in COLUMNS if any(c in r for r in rows)]
    return markdown([[_fmt(r.get(c)) for c in used] for r in rows], used)


def ratios(rows) -> str:
    """pyfuser / inductor per model and dtype (fwd, train, cold, warm)."""
    by = {(r["model"], r["dtype"], r["mode"]): r for r in rows}
    lines = []
    for (m, d, mode), r in by.items():
        ind = by.get((m, d, "inductor"))
        if mode != "pyfuser" or ind is None:
            continue
        parts = []
        for k in ("fwd_ms", "train_ms", "cold_s", "warm_s"):
            if k in r and k in ind and ind[k]:
                parts.append(f"{k} {r[k] / ind[k]:.2f}")
        lines.append(f"- {m} {d}: pyfuser / inductor " + ", ".join(parts))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--size", default="", help="batch,seq,hidden,layers (default 8,512,768,4)")
    p.add_argument("--dropout", type=float, default=None,
                   help="every dropout probability (default: the configs' own)")
    p.add_argument("--no-compile-times", action="store_true", help="skip the warm compile")
    p.add_argument("--keep-caches", action="store_true", help="use the existing cache dirs")
    p.add_argument("--dry-run", action="store_true", help="CPU, small sizes, no Inductor")
    p.add_argument("--budget", type=float, default=480.0)
    args = p.parse_args(argv)
    _fresh_caches(args.keep_caches or args.dry_run)
    import torch
    TC = _load_corpus()
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    size = TC.BENCH if device == "cuda" else TC.SMALL
    if args.size:
        b, s, h, n = (int(v) for v in args.size.split(","))
        size = dataclasses.replace(size, batch=b, seq=s, hidden=h, layers=n)
    modes = [m for m in args.modes.split(",") if m]
    if device == "cpu":
        modes = [m for m in modes if m != "inductor"]
    start, rows = time.perf_counter(), []
    for name in filter(None, args.models.split(",")):
        for dtype in filter(None, args.dtypes.split(",")):
            if device == "cpu" and dtype == "bfloat16":
                continue
            for mode in modes:
                if time.perf_counter() - start > args.budget:
                    rows.append({"model": name, "dtype": dtype, "mode": mode,
                                 "error": "skipped: time budget"})
                    continue
                try:
                    rows.append(run_case(TC, name, dtype, mode, size, device, args.dropout,
                                         not args.no_compile_times))
                except Exception as e:  # noqa: BLE001 - a failure is a row, not the end
                    traceback.print_exc()
                    rows.append({"model": name, "dtype": dtype, "mode": mode,
                                 "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"})
                print(rows[-1], flush=True)
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (kernel interpreter)"
    text = (f"models through torch.compile on {gpu}, torch {torch.__version__}, batch "
            f"{size.batch} x {size.seq}, hidden {size.hidden}, {size.layers} layers, "
            f"{time.perf_counter() - start:.0f} s\n\n{table(rows)}\n\n{ratios(rows)}\n")
    print(text)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_models.md"), "w") as fh:
            fh.write(text)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
