"""Real models through pyfuser.jit: forward time against eager and torch.compile (one GPU).

    PYTHONPATH=. python3 bench/models_jit.py                 # GPU; $OUT/bench_models.md if OUT set
    PYTHONPATH=. python3 bench/models_jit.py --models gpt2,llama --scale 8 --no-compile
    PYTHONPATH=. python3 bench/models_jit.py --dry-run       # CPU, the corpus' own sizes

The models are tests/cpu/model_corpus.py's (HF transformers BERT, GPT-2, Llama, T5 encoder, ViT;
ResNet-18 eval and train, traced and scripted), random weights, widths and sequence length (or
image size) times `--scale` (default 4 on a GPU: hidden 128, 32 tokens). Per model, under
torch.no_grad(): pyfuser's groups, kernels per forward (`last_run`), eager groups, the unfused
candidate ops by kind; then, checked against eager first (a mismatch is reported, not timed),
the median forward time of eager, torch.compile (default mode; its compile time apart) and
pyfuser.jit (bench/common.bench_us: do_bench with L2 flush), and the CUDA kernels one forward
launches in each (torch.profiler, memcpy/memset excluded). `--dry-run` runs everything on the
CPU through the kernel interpreter, times with perf_counter and counts pyfuser's kernels only:
its table (groups / kernels / fallbacks) is the one docs/models.md records.
Time budget: `--budget` seconds (default 540); models that would start after it are skipped.
"""
from __future__ import annotations

import argparse
import collections
import copy
import os
import statistics
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from bench.common import load_module_from_path  # noqa: E402

# registered (dataclasses look their module up while defining), replacing any earlier one
M = load_module_from_path("model_corpus", os.path.join(ROOT, "tests", "cpu", "model_corpus.py"),
                          fresh=True)


def _cpu_ms(fn, reps: int = 3) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _gpu_ms(fn) -> float:
    from bench.common import bench_us
    return bench_us(fn) / 1e3


def _kernels(fn):
    from bench.common import count_kernels
    return count_kernels(fn)


def _matches(got, want) -> str:
    g, w = M.tensors(got), M.tensors(want)
    if len(g) != len(w):
        return f"{len(g)} outputs, eager has {len(w)}"
    for i, (a, b) in enumerate(zip(g, w)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i}: {tuple(a.shape)} {a.dtype} vs eager {tuple(b.shape)} {b.dtype}"
        if not torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-3):
            return f"output {i}: max abs err {float((a.float() - b.float()).abs().max()):.3g}"
    return ""


def _unfused(fallbacks) -> str:
    kinds = collections.Counter(f["kind"].split("::")[-1] for f in fallbacks
                                if f["kind"] != "prim::PyfuserGroup")
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "-"


def run_case(case, device: str, scale: int, compile_: bool) -> dict:
    row = {"model": f"{case.name} ({case.how})"}
    model, inputs = case.build(device, scale)
    obj = M.compile_case(case, model, inputs)
    ref_model = copy.deepcopy(model)
    f = pyfuser_jit(obj, device)
    with torch.no_grad():
        got = f(*inputs)
        want = ref_model(*inputs)
        run = f.last_run
        row.update(groups=run.groups, kernels=run.kernels, eager_groups=run.eager_groups,
                   unfused=_unfused(run.fallbacks))
        bad = _matches(got, want)
        if bad:
            row["error"] = f"differs from eager: {bad}"
            return row
        timer = _gpu_ms if device == "cuda" else _cpu_ms
        row["eager_ms"] = timer(lambda: ref_model(*inputs))
        row["pyfuser_ms"] = timer(lambda: f(*inputs))
        if device == "cuda":
            row["eager_kernels"] = _kernels(lambda: ref_model(*inputs))
            row["pyfuser_cuda_kernels"] = _kernels(lambda: f(*inputs))
        if compile_:
            try:
                tc = torch.compile(copy.deepcopy(model))
                t0 = time.perf_counter()
                out = tc(*inputs)
                row["compile_s"] = time.perf_counter() - t0
                bad = _matches(out, want)
                if bad:
                    row["compile_error"] = bad
                else:
                    row["compile_ms"] = timer(lambda: tc(*inputs))
                    if device == "cuda":
                        row["compile_kernels"] = _kernels(lambda: tc(*inputs))
            except Exception as e:  # noqa: BLE001 - report, keep going
                row["compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return row


def pyfuser_jit(obj, device):
    import pyfuser
    return pyfuser.jit(obj, cpu_executor="interpret" if device == "cpu" else None)


def _fmt(v) -> str:
    if v is None:
        return ""
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def table(rows, device: str) -> str:
    from bench.common import markdown
    cols = ["model", "groups", "kernels", "eager_groups", "unfused", "eager_ms", "compile_ms",
            "pyfuser_ms", "compile_s"]
    if device == "cuda":
        cols += ["eager_kernels", "compile_kernels", "pyfuser_cuda_kernels"]
    cols += ["error", "compile_error"]
    used = [c for c in cols if any(c in r for r in rows)]
    return markdown([[_fmt(r.get(c)) for c in used] for r in rows], used)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="CPU, corpus sizes, no torch.compile")
    p.add_argument("--models", default="", help="comma list of case names (default: all)")
    p.add_argument("--scale", type=int, default=None, help="width/sequence multiplier")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--budget", type=float, default=540.0)
    args = p.parse_args(argv)
    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    scale = args.scale or (4 if device == "cuda" else 1)
    wanted = set(filter(None, args.models.split(",")))
    start, rows = time.perf_counter(), []
    from pyfuser.progress import track
    cases = [c for c in M.CASES if not wanted or c.name in wanted]
    for case in track(cases, "models", name=lambda c: f"{c.name} ({c.how})"):
        if not M.available(case):
            rows.append({"model": f"{case.name} ({case.how})", "error": f"{case.needs} missing"})
            continue
        if time.perf_counter() - start > args.budget:
            rows.append({"model": f"{case.name} ({case.how})", "error": "skipped: time budget"})
            continue
        try:
            rows.append(run_case(case, device, scale,
                                 compile_=not args.no_compile and device == "cuda"))
        except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end
            traceback.print_exc()
            rows.append({"model": f"{case.name} ({case.how})",
                         "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"})
        print(rows[-1], flush=True)
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU (kernel interpreter)"
    text = (f"models through pyfuser.jit on {gpu}, torch {torch.__version__}, scale {scale}, "
            f"ResNet-18 from {M.resnet_source()}\n\n{table(rows, device)}\n")
    print(text)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_models.md"), "w") as fh:
            fh.write(text)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
