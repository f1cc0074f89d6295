"""Reductions and normalizations: pyfuser vs eager vs torch.compile (and Quack / Liger where they
import), with a same-size copy as the bandwidth reference (one GPU, one run).

    PYTHONPATH=. python3 bench/normalization.py [--dtypes float32,bfloat16] [--no-compile]
        [--only layer_norm,softmax] [--flush write|read] [--frontend jit|compile]

Each workload is written as eager PyTorch (the function below); pyfuser runs the same function
through `pyfuser.jit(torch.jit.script(fn))`, or with `--frontend compile` through
`pyfuser.compile(fn)` (torch.compile's aten graph: cross-entropy arrives as nll_loss of a
log_softmax, not as `cross_entropy_loss`). Per row and dtype: median µs per call (bench_us:
do_bench with its L2 flush by default, the issues' method), and % = (the workload's minimum bytes
moved / time) / (bytes / time of a same-size copy_ timed the same way). pyfuser's result is
checked against eager before it is timed (a wrong result marks the cell "WRONG"); kernels per
call of pyfuser come from the torch profiler. Writes $OUT/bench_normalization.md when OUT is set,
and beside it bench_normalization.svg / .json: % of the copy rate per workload and dtype for
eager, torch.compile and pyfuser (common.save_plot).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_us, compile_static, count_kernels, markdown, same_size_copy_us, save_plot  # noqa: E402
from plot import parse_pct  # noqa: E402

from pyfuser.progress import Progress  # noqa: E402

F = torch.nn.functional


# ---- workloads: name -> (fn, make inputs(dtype), minimum bytes(inputs, outputs)) --------------
class LayerNorm(torch.nn.Module):
    """F.layer_norm over a constant normalized shape, as nn.LayerNorm passes it (its
    `normalized_shape` is a TorchScript constant); weight and bias as inputs."""
    __constants__ = ["n"]

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x, w, b):
        return F.layer_norm(x, [self.n], w, b, 1e-5)


class LayerNormBackward(torch.nn.Module):
    """aten's layer norm backward (dx, dweight, dbias), as a training step's backward graph
    calls it: row sums for dx and sums over the rows for dweight / dbias (pyfuser: one
    inner-outer persistent kernel). `n` is a TorchScript constant, as nn.LayerNorm declares its
    `normalized_shape` (read as a module attribute, the call's fusion group could not be bound
    by the call plan: one more key over the six inputs; host time a call 35 -> 11 µs through
    tools/host_stub.py on the CPU machine)."""
    __constants__ = ["n"]

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, dy, x, mean, rstd, w, b):
        return torch.ops.aten.native_layer_norm_backward(dy, x, [self.n], mean, rstd, w, b,
                                                         [True, True, True])


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def softmax(x):
    return torch.softmax(x, -1)


def log_softmax(x):
    return torch.log_softmax(x, -1)


def sum_last(x):
    return x.sum(-1)


def sum_first(x):
    return x.sum(0)


def var_mean_last(x):
    return torch.var_mean(x, -1)


def batch_norm_train(x, w, b):
    return F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5)


def cross_entropy(x, t):
    return F.cross_entropy(x, t)


def _rows(m, n, params=0):
    def make(dt):
        x = torch.randn(m, n, device="cuda", dtype=dt)
        return [x] + [torch.randn(n, device="cuda", dtype=dt) for _ in range(params)]
    return make


def _ln_backward(m, n):
    def make(dt):
        x = torch.randn(m, n, device="cuda", dtype=dt)
        w, b = (torch.randn(n, device="cuda", dtype=dt) for _ in range(2))
        _, mean, rstd = torch.native_layer_norm(x, [n], w, b, 1e-5)   # eager's statistics
        return [torch.randn(m, n, device="cuda", dtype=dt), x, mean, rstd, w, b]
    return make


def _bn(dt):
    return [torch.randn(32, 256, 56, 56, device="cuda", dtype=dt),
            torch.randn(256, device="cuda", dtype=dt), torch.randn(256, device="cuda", dtype=dt)]


def _ce(dt):
    return [torch.randn(4096, 32000, device="cuda", dtype=dt),
            torch.randint(0, 32000, (4096,), device="cuda")]


def nbytes(ts) -> int:
    out = 0
    for t in ts if isinstance(ts, (list, tuple)) else [ts]:
        if isinstance(t, torch.Tensor):
            out += t.numel() * t.element_size()
        elif isinstance(t, (list, tuple)):
            out += nbytes(t)
    return out


WORKLOADS = []
for _m, _n in ((8192, 3072), (32768, 256), (1024, 65536)):
    WORKLOADS.append((f"layer_norm {_m}x{_n}", LayerNorm(_n), _rows(_m, _n, 2)))
for _m, _n in ((8192, 3072), (32768, 256), (1024, 65536)):
    WORKLOADS.append((f"rms_norm {_m}x{_n}", rms_norm, _rows(_m, _n, 1)))
for _m, _n in ((8192, 3072), (32768, 256), (1024, 65536)):
    WORKLOADS.append((f"softmax {_m}x{_n}", softmax, _rows(_m, _n)))
for _m, _n in ((4096, 768), (8192, 3072)):
    WORKLOADS.append((f"layer norm backward {_m}x{_n}", LayerNormBackward(_n), _ln_backward(_m, _n)))
WORKLOADS += [("cross_entropy 4096x32000", cross_entropy, _ce),
              ("log_softmax 8192x3072", log_softmax, _rows(8192, 3072)),
              ("sum(-1) 8192x3072", sum_last, _rows(8192, 3072)),
              ("sum(0) 8192x3072", sum_first, _rows(8192, 3072)),
              ("var_mean(-1) 8192x3072", var_mean_last, _rows(8192, 3072)),
              ("batch_norm training 32x256x56x56", batch_norm_train, _bn)]


def _outputs_match(got, want, dt) -> bool:
    got = got if isinstance(got, (list, tuple)) else [got]
    want = want if isinstance(want, (list, tuple)) else [want]
    tol = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}[dt]
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            return False
        if not torch.allclose(g.float(), w.float(), rtol=tol, atol=tol * max(1.0, float(w.float().abs().max()))):
            return False
    return True


def _extra_impls():
    """Other implementations that import here: {name: {workload prefix: fn(*inputs)}}."""
    out = {}
    try:
        import quack  # noqa: F401
        from quack.rmsnorm import rmsnorm as q_rms
        from quack.softmax import softmax as q_softmax
        out["Quack"] = {"rms_norm": lambda x, w: q_rms(x, w, eps=1e-6),
                        "softmax": lambda x: q_softmax(x)}
    except Exception:  # noqa: BLE001 - not installed or another API: no column
        pass
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        out["Liger"] = {"rms_norm": lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6),
                        "layer_norm": lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, 1e-5)}
    except Exception:  # noqa: BLE001
        pass
    return out


def _pyfuser_fn(fn, frontend: str):
    """(the function pyfuser runs, its count of fallbacks after a call)."""
    import pyfuser
    if frontend == "compile":
        from pyfuser.frontend.fx import compiled_graphs
        torch._dynamo.reset()      # static sizes: a workload's other sizes recompile as such
        cfn = pyfuser.compile(fn, dynamic=False)

        def unfused():             # the graph's nodes left to aten (views included)
            return sum(compiled_graphs()[-1].report()["unfused"].values())
        return cfn, unfused
    pf = pyfuser.jit(torch.jit.script(fn))

    def fallbacks():
        st = pf.last_run
        return len(st.fallbacks) + st.eager_groups + st.eager_segments
    return pf, fallbacks


def run(dtypes, use_compile: bool, only, flush: str, frontend: str = "jit"):
    extras = _extra_impls()
    rows, log = [], []
    copies = {}
    todo = [name for name, _, _ in WORKLOADS if not only or any(name.startswith(o) for o in only)]
    progress = Progress(len(todo) * len(dtypes), "normalization")
    for name, fn, make in WORKLOADS:
        if only and not any(name.startswith(o) for o in only):
            continue
        for dt in dtypes:
            cells = {"workload": name, "dtype": str(dt).replace("torch.", "")}
            progress.start(f"{name} {cells['dtype']}")
            try:
                torch.manual_seed(0)
                xs = make(dt)
                want = fn(*xs)
                moved = nbytes(xs) + nbytes(want)
                if moved not in copies:
                    copies[moved] = same_size_copy_us(moved, flush)
                cu = copies[moved]
                pct = lambda us: 100.0 * cu / us  # noqa: E731  (min bytes / t over bytes / t_copy)
                t_e = bench_us(lambda: fn(*xs), flush=flush)
                cells["eager"] = f"{t_e:.1f} ({pct(t_e):.0f}%)"
                if use_compile:
                    t0 = time.perf_counter()
                    cfn = compile_static(fn)
                    cfn(*xs)
                    torch.cuda.synchronize()
                    cells["compile_s"] = f"{time.perf_counter() - t0:.1f}"
                    t_c = bench_us(lambda: cfn(*xs), flush=flush)
                    cells["torch.compile"] = f"{t_c:.1f} ({pct(t_c):.0f}%)"
                t0 = time.perf_counter()
                pf, fallbacks = _pyfuser_fn(fn, frontend)
                got = pf(*xs)
                torch.cuda.synchronize()
                cells["pyfuser_first_s"] = f"{time.perf_counter() - t0:.2f}"
                if not _outputs_match(got, want, dt):
                    cells["pyfuser"] = "WRONG"
                else:
                    t_p = bench_us(lambda: pf(*xs), flush=flush)
                    cells["pyfuser"] = f"{t_p:.1f} ({pct(t_p):.0f}%)"
                    cells["kernels"] = count_kernels(lambda: pf(*xs))
                    cells["fallbacks"] = fallbacks()
                for ename, impls in extras.items():
                    impl = next((f for k, f in impls.items() if name.startswith(k)), None)
                    if impl is not None:
                        try:
                            impl(*xs)
                            t_x = bench_us(lambda: impl(*xs), flush=flush)
                            cells[ename] = f"{t_x:.1f} ({pct(t_x):.0f}%)"
                        except Exception as e:  # noqa: BLE001
                            cells[ename] = f"error: {type(e).__name__}"
                cells["copy"] = f"{cu:.1f}"
            except Exception:  # noqa: BLE001 - one bad row does not stop the table
                log.append(f"{name} {dt}:\n{traceback.format_exc()}")
                cells["pyfuser"] = cells.get("pyfuser", "ERROR")
            rows.append(cells)
            print(cells, flush=True)
            progress.finish()
    progress.close()
    headers = ["workload", "dtype", "eager"] + (["torch.compile"] if use_compile else []) + \
        ["pyfuser"] + list(extras) + ["kernels", "fallbacks", "copy", "pyfuser_first_s"] + \
        (["compile_s"] if use_compile else [])
    table = markdown([[r.get(h, "-") for h in headers] for r in rows], headers)
    return table, log, rows


def plot_rows(rows) -> list:
    """The table's cells as % of the copy rate per series (None where a cell has no %)."""
    return [{"workload": f"{r['workload']} {r['dtype']}",
             **{s: parse_pct(r.get(s, "-")) for s in ("eager", "torch.compile", "pyfuser")}}
            for r in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--flush", default="write", choices=("write", "read"))
    ap.add_argument("--frontend", default="jit", choices=("jit", "compile"))
    a = ap.parse_args()
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    only = [o for o in a.only.split(",") if o]
    from pyfuser.runtime import native
    # an install step (make setup), as bench/models.py does: a fresh GPU machine has no native
    # cached-call runner, and without it the host-bound rows (layer norm backward 4096x768)
    # time Python's call path (42.7 µs against 21.6)
    runner = native.build() is not None
    table, log, rows = run(dtypes, not a.no_compile, only, a.flush, a.frontend)
    head = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flush={a.flush}, "
            f"pyfuser through {'pyfuser.compile' if a.frontend == 'compile' else 'pyfuser.jit'}"
            f"{' (fallbacks: nodes left to aten, views included)' if a.frontend == 'compile' else ''}, "
            f"native cached-call runner {'on' if runner else 'OFF'}; cells: median µs (% of a same-size copy's rate)")
    print(head)
    print(table)
    for entry in log:
        print(entry)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_normalization.md"), "w") as fh:
            fh.write(head + "\n\n" + table + "\n")
    save_plot("bench_normalization", f"{torch.cuda.get_device_name()}, bench/normalization.py, "
              f"flush={a.flush}: % of the copy rate", plot_rows(rows))


if __name__ == "__main__":
    main()
