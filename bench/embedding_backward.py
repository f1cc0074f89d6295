"""Benchmark of an embedding table's weight gradient, `aten.embedding_dense_backward`: eager,
torch.compile (Inductor) and pyfuser in one run on one GPU, with a same-size copy as reference.

    PYTHONPATH=. python3 bench/embedding_backward.py [--rows 2,512,8192,30522] [--dtypes ...]

Indices [8, 512] drawn uniformly from the table's rows, gradient [8, 512, 768]. Minimum bytes
moved: the gradient read once, the indices read once, the weight gradient written once; % of a
copy = (those bytes / time) / (a copy's bytes / its time) (bench/common.py, `flush="write"`).
Also per mode: host µs of one call (bench/common.host_us_interleaved), kernels a call, and
whether two calls give the same bits (Inductor's scatter adds with float atomics; eager's and
pyfuser's sums have a fixed order). pyfuser builds its native cached-call runner first.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

TOKENS = (8, 512)
HIDDEN = 768


def _case(rows: int, dtype):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    idx = torch.randint(0, rows, TOKENS, device="cuda", generator=gen)
    grad = torch.randn(*TOKENS, HIDDEN, device="cuda", generator=gen).to(dtype)
    return grad, idx


def _fn(rows: int):
    def f(g, i):
        return torch.ops.aten.embedding_dense_backward(g, i, rows, -1, False)
    return f


def run(rows_list, dtypes) -> list:
    import pyfuser
    from pyfuser.runtime import native
    native.build()
    out = []
    for rows in rows_list:
        for dtype in dtypes:
            grad, idx = _case(rows, dtype)
            f = _fn(rows)
            paths = {"eager": f, "torch.compile": C.compile_static(f), "pyfuser": pyfuser.compile(f)}
            calls = {k: (lambda fn=fn: fn(grad, idx)) for k, fn in paths.items()}
            want = f(grad.double(), idx)
            nbytes = grad.numel() * grad.element_size() + idx.numel() * idx.element_size() \
                + rows * HIDDEN * grad.element_size()
            copy_us = C.same_size_copy_us(nbytes)
            host = C.host_us_interleaved(calls)
            row = {"workload": f"embedding backward {rows} rows", "dtype": str(dtype)[6:],
                   "copy": round(copy_us, 1)}
            for k, call in calls.items():
                a, b = call(), call()
                us = C.bench_us(call)
                err = (a.double() - want).abs().max().item()
                row[k] = f"{us:.1f} ({100 * copy_us / us:.0f}%)"
                row[k + " host"] = round(host[k], 1)
                row[k + " kernels"] = C.count_kernels(call)
                row[k + " same bits"] = "yes" if torch.equal(a, b) else "no"
                row[k + " err"] = f"{err:.1e}"
            out.append(row)
            print(row, flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="2,512,8192,30522")
    p.add_argument("--dtypes", default="float32,bfloat16")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/embedding_backward.py needs a GPU")
        return 1
    rows = run([int(r) for r in a.rows.split(",")],
               [getattr(torch, d) for d in a.dtypes.split(",")])
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, indices {TOKENS}, "
          f"H {HIDDEN}, µs (% of a copy)\n")
    headers = list(rows[0].keys())
    print(C.markdown([[r[h] for h in headers] for r in rows], headers))
    C.save_plot("bench_embedding_backward", "embedding_dense_backward",
                [{"workload": f"{r['workload']} {r['dtype']}",
                  **{k: float(r[k].split("(")[1].rstrip("%)")) for k in
                     ("eager", "torch.compile", "pyfuser")}} for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
