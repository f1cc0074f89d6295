"""`pyfuser run` with fusion: fuse a graph, run it on random inputs, compare with eager.

`fuse_report(graph, device, seed, shrink=None, bench=False) -> dict` adds to the CLI's report:
`groups`, `kernels` (kernel launches in one call), `host_segments` (group segments run as
views on the host, no kernel; both from the dispatcher's RunReport of each group call),
`fallbacks` ([{node, kind, reason}] for
each unfused candidate op and each failed guard), `matches_eager`, `max_abs_err`,
`executor` (cuda / interpret / evaluator), `fused_graph` (text), `shrunk_to` (when sizes
were capped) and, with bench, `bench` ({eager_ms, pyfuser_ms, torch_compile_ms} or a
`skipped` message). On CPU the groups run through the codegen's CPU interpreter when it
exists (kernels counted as a GPU run would launch them), else the reference evaluator.
Eager reference = the unfused graph through the eager runner, on a copy of the same inputs.
"""
from __future__ import annotations

import os
import time

import torch

from .inputs import make_inputs
from .jit import CompiledGraph, eager_handler
from .run_limits import CPU_LARGE_NUMEL, DEFAULT_SHRINK
from .runner import run_graph

# Above this many elements in one input, `pyfuser demo` on the CPU caps every size
# (make_inputs' size_override); `pyfuser run` refuses without --shrink or --full-size
# (run_limits.py). Seed 003's graph (6.4M elements an input) runs at full size in ~4 s; seed
# 000's (130M, 3.6 GB of inputs and output) takes ~30 s and ~9 GB on a 2-core machine.
CPU_AUTO_SHRINK_NUMEL = CPU_LARGE_NUMEL
CPU_AUTO_SHRINK_TO = DEFAULT_SHRINK


def needs_shrink(graph) -> bool:
    from .types import TensorType
    for v in graph.inputs:
        t = v.type
        if isinstance(t, TensorType) and t.sizes and None not in t.sizes:
            n = 1
            for s in t.sizes:
                n *= s
            if n > CPU_AUTO_SHRINK_NUMEL:
                return True
    return False


def clone_inputs(xs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def compare(ref: list, out: list) -> tuple:
    """(matches, max_abs_err) over all outputs, tuples / lists / dicts of tensors included
    (compared element by element); dtypes and shapes must be equal."""
    ok, err = True, 0.0
    for a, b in _leaves(ref, out):
        if a is _MISMATCH:
            return False, float("inf")
        if not isinstance(a, torch.Tensor):
            ok = ok and not isinstance(b, torch.Tensor) and type(a) is type(b) and a == b
            continue
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False, float("inf")
        if a.numel() and not torch.equal(a, b):
            d = (a.double() - b.double()).abs() if not a.is_complex() else (a - b).abs().double()
            d = torch.nan_to_num(d, nan=0.0)
            err = max(err, float(d.max()))
        if a.is_floating_point() or a.is_complex():
            ok = ok and torch.allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)
        else:
            ok = ok and torch.equal(a, b)
    return bool(ok), err


_MISMATCH = object()


def _leaves(a, b):
    """Pairs of corresponding leaves of two nested outputs; (_MISMATCH, None) where their
    structure differs."""
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or type(a) is not type(b) or len(a) != len(b):
            yield _MISMATCH, None
            return
        for x, y in zip(a, b):
            yield from _leaves(x, y)
    elif isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            yield _MISMATCH, None
            return
        for k in a:
            yield from _leaves(a[k], b[k])
    else:
        yield a, b


def _time_ms(fn, device, reps=20) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000.0 / reps


def _bench(graph, compiled, inputs, device) -> dict:
    if device != "cuda" or not torch.cuda.is_available():
        return {"skipped": "no GPU: --bench times CUDA runs only"}
    eager = lambda: run_graph(graph, inputs, device=device, node_handler=eager_handler)  # noqa: E731
    result = {"eager_ms": _time_ms(eager, device),
              "pyfuser_ms": _time_ms(lambda: compiled.run(inputs, device=device), device)}
    try:
        tc = torch.compile(lambda *xs: run_graph(graph, list(xs), device=device,
                                                 node_handler=eager_handler))
        result["torch_compile_ms"] = _time_ms(lambda: tc(*inputs), device)
    except Exception as e:  # noqa: BLE001 - report, do not fail the run
        result["torch_compile_ms"] = None
        result["torch_compile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return result


def fuse_report(graph, device: str, seed: int = 0, shrink=None, bench: bool = False,
                inputs=None, ref=None) -> dict:
    """`inputs` / `ref`: inputs already made (the fused graph may write them) and eager's outputs
    on copies of them; made here when not given."""
    compiled = CompiledGraph(graph, cpu_executor="interpret")
    if inputs is None:
        inputs = make_inputs(graph, device=device, seed=seed, size_override=shrink)
    if ref is None:
        ref = run_graph(graph, clone_inputs(inputs), device=device, node_handler=eager_handler)
    out = compiled.run(clone_inputs(inputs) if bench else inputs, device=device)
    ok, err = compare(ref, out)
    stats = compiled.last_run
    report = {"groups": stats.groups, "kernels": stats.kernels,
              "host_segments": stats.host_segments, "fallbacks": stats.fallbacks,
              "matches_eager": ok, "max_abs_err": err,
              "executor": "cuda" if device == "cuda" else compiled.cpu_mode,
              "fused_graph": str(compiled.graph), "outputs_fused": len(out)}
    if shrink is not None:
        report["shrunk_to"] = shrink
    if bench:
        report["bench"] = _bench(graph, compiled, inputs, device)
    return report


def text_summary(report: dict) -> str:
    lines = [report["fused_graph"].rstrip()]
    if report.get("shrunk_to"):
        lines.append(f"(sizes capped at {report['shrunk_to']} for this CPU run)")
    host = f", host segments: {report['host_segments']}" if report.get("host_segments") else ""
    lines.append(f"groups: {report['groups']}, kernels per call: {report['kernels']}{host} "
                 f"({report['executor']})")
    for f in report["fallbacks"]:
        lines.append(f"  eager: {f['node']}: {f['reason']}")
    lines.append(f"matches eager: {report['matches_eager']} "
                 f"(max abs err {report['max_abs_err']:.3g})")
    if "bench" in report:
        lines.append(f"bench: {report['bench']}")
    return "\n".join(lines)


def demo_line(path: str, report: dict) -> str:
    """One line of `pyfuser demo`'s report for one graph."""
    ok = "matches eager" if report["matches_eager"] else "DIFFERS FROM EAGER"
    capped = f", sizes capped at {report['shrunk_to']}" if report.get("shrunk_to") else ""
    falls = f", {len(report['fallbacks'])} eager fallback(s)" if report["fallbacks"] else ""
    host = f" + {report['host_segments']} host view(s)" if report.get("host_segments") else ""
    return (f"{path}: {report['groups']} group(s), {report['kernels']} kernel(s){host} per call "
            f"({report['executor']}{capped}){falls}; {ok} (max abs err "
            f"{report['max_abs_err']:.3g})")


def demo_env(device: str = "cpu", show_cuda: bool = False, cuda_dir=None) -> dict:
    """Environment for `pyfuser demo`: the CPU interpreter on a CPU-only machine; the CUDA
    source printed (`cuda_kernel` dump) or written to files (`cuda_to_file`, with the disk
    cache off so that every kernel is compiled, hence written) when asked."""
    env = {"PYFUSER_CPU_EXECUTOR": "interpret"} if device == "cpu" else {}
    dumps = set(filter(None, os.environ.get("PYFUSER_DUMP", "").split(",")))
    if show_cuda:
        dumps.add("cuda_kernel")
    if cuda_dir:
        dumps.add("cuda_to_file")
        env["PYFUSER_DUMP_DIR"] = os.path.abspath(cuda_dir)
        env["PYFUSER_DISABLE_DISK_CACHE"] = "1"
    if dumps:
        env["PYFUSER_DUMP"] = ",".join(sorted(dumps))
    return env
