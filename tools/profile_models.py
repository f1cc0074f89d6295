"""Where a model's forward spends its GPU time: eager vs Inductor vs the pyfuser backend, kernel
by kernel, from the torch profiler (for finding why a model is slower than Inductor).

    PYTHONPATH=. python3 tools/profile_models.py [--model bert] [--dtype float32] [--top 25]
        [--step forward|train] [--size batch,seq,hidden,layers] [--graphs FILE] [--gaps N]
    PYTHONPATH=. python3 tools/profile_models.py --dry-run      # CPU, tiny sizes, aten op times
                                                                 # (nested ops counted in each): a smoke check
    PYTHONPATH=. python3 tools/profile_models.py --model resnet18 \
        --modes eager,inductor,pyfuser_nchw,pyfuser_nhwc [--step train]
        # issue 16: pyfuser with its channels-last pass off (PYFUSER_CHANNELS_LAST=0) and on
        # (=1, also for training graphs, which its default leaves NCHW): cuDNN's nchwToNhwc /
        # nhwcToNchw rows go away; `pyfuser` is the default (auto: on for an eval forward);
        # pyfuser_nhwc_split adds PYFUSER_OUTER_SPLIT=1 (training batch norms over NHWC)

Builds the model of bench/models.py (tests/cpu/train_corpus.py, random weights), compiles it
per mode, warms it up, then profiles a few forwards and prints, per mode: GPU time per forward,
kernels per forward, and the `--top` kernels by total time (name, calls per forward, µs per
forward, share). pyfuser's kernels are named after their ops (`pf_..._kernel`), so the rows
show which fused regions cost what against the aten and Triton kernels of the other modes.
With `--gaps N`, the GPU's idle time between the first and the last kernel of the profiled
steps and its N largest gaps, each between the kernels around it: a step slower than its GPU
time is either host-bound (many small gaps) or synchronized (a few long ones).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def profile_forward(case, mode: str, reps: int, device: str, step: str = "forward"):
    """(total µs per step, kernels per step, [(name, calls, µs)] per step, GPU intervals
    [(start µs, end µs, name)] of all the profiled steps); a step is a forward or, with
    step="train", a training step (forward, loss, backward, SGD)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    if mode in ("pyfuser_nchw", "pyfuser_nhwc", "pyfuser_nhwc_split"):
        # the channels-last pass off / forced on (/ with the outer normalizations' split)
        with _env("PYFUSER_CHANNELS_LAST", "0" if mode == "pyfuser_nchw" else "train"), \
                _env("PYFUSER_OUTER_SPLIT", "1" if mode.endswith("split") else "0"):
            return profile_forward(case, "pyfuser", reps, device, step)
    model, fn, opt = case.make(mode)

    def run():
        return case.forward(model, fn) if step == "forward" else case.train_step(model, fn, opt)
    for _ in range(3):
        run()
    if device == "cuda":
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            run()
        if device == "cuda":
            torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])
    intervals = []
    for ev in prof.events():
        if device == "cuda":
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            t = ev.device_time
            intervals.append((ev.time_range.start, ev.time_range.end, ev.name))
        else:
            if not ev.name.startswith("aten::"):
                continue
            t = ev.cpu_time
        per[ev.name][0] += 1
        per[ev.name][1] += t
    rows = [(name, calls / reps, us / reps) for name, (calls, us) in per.items()]
    rows.sort(key=lambda r: -r[2])
    return sum(r[2] for r in rows), sum(r[1] for r in rows), rows, intervals


class _env:
    """An environment variable set for a block (the backend reads its knobs when it compiles,
    at the first calls: the whole profile runs inside)."""

    def __init__(self, name: str, value: str):
        self.name, self.value = name, value

    def __enter__(self):
        self.old = os.environ.get(self.name)
        os.environ[self.name] = self.value

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop(self.name, None)
        else:
            os.environ[self.name] = self.old


def gpu_gaps(intervals, top: int):
    """(span µs, busy µs, [(gap µs, kernel before, kernel after)] largest first) of GPU
    intervals (start µs, end µs, name): where the GPU waited for the host between the first
    kernel's start and the last one's end (a host-bound stretch or a synchronization)."""
    if not intervals:
        return 0.0, 0.0, []
    iv = sorted(intervals)
    busy, gaps = 0.0, []
    cur_s, cur_e, cur_name = iv[0]
    for s, e, name in iv[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            gaps.append((s - cur_e, cur_name, name))
            cur_s, cur_e, cur_name = s, e, name
        elif e > cur_e:
            cur_e, cur_name = e, name
    busy += cur_e - cur_s
    gaps.sort(key=lambda g: -g[0])
    return max(e for _, e, _ in iv) - iv[0][0], busy, gaps[:top]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert", choices=("bert", "gpt2", "llama", "resnet18"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--modes", default="eager,inductor,pyfuser")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, CPU op times")
    ap.add_argument("--step", default="forward", choices=("forward", "train"))
    ap.add_argument("--size", default="", help="batch,seq,hidden,layers (default: the bench's)")
    ap.add_argument("--gaps", type=int, default=0, help="print the N largest stretches the "
                    "GPU sat idle between kernels (host-bound or synchronized)")
    ap.add_argument("--graphs", default="", help="write pyfuser's rewritten graphs (code and "
                    "each region's ops) to this file")
    args = ap.parse_args(argv)
    import torch
    import models as BM
    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    TC = BM.load_corpus()
    size = BM.profile_size(TC, device, args.size)
    case = BM.Case(TC, args.model, args.dtype, size, device, dropout=None)
    modes = [m for m in args.modes.split(",") if m]
    if device == "cpu":
        modes = [m for m in modes if m != "inductor"]
    for mode in modes:
        torch._dynamo.reset()
        total, kernels, rows, intervals = profile_forward(case, mode, args.reps, device,
                                                          args.step)
        unit = "GPU" if device == "cuda" else "CPU (aten ops)"
        print(f"\n== {args.model} {args.dtype} {mode}: {total:.1f} µs {unit} per {args.step}, "
              f"{kernels:.0f} {'kernels' if device == 'cuda' else 'ops'} per {args.step}")
        print("| name | calls | µs | share |\n|---|---|---|---|")
        for name, calls, us in rows[:args.top]:
            print(f"| {name[:90]} | {calls:.0f} | {us:.1f} | {100 * us / max(total, 1e-9):.1f}% |")
        if args.gaps and device == "cuda":
            span, busy, gaps = gpu_gaps(intervals, args.gaps)
            print(f"\nGPU idle: {span - busy:.0f} of {span:.0f} µs over {args.reps} steps "
                  f"({args.reps} back to back); largest gaps:")
            print("| gap µs | after | before |\n|---|---|---|")
            for g, a, b in gaps:
                print(f"| {g:.1f} | {a[:60]} | {b[:60]} |")
    if args.graphs and "pyfuser" in modes:
        write_graphs(args.graphs)
    return 0


def write_graphs(path: str) -> None:
    """Every graph the backend compiled in this process: its report, its rewritten code, and
    the ops of each fused region with its nodes and their arguments (to map the profile's pf_
    kernels and aten kernels to nodes)."""
    from pyfuser.frontend.fx import compiled_graphs
    with open(path, "w") as f:
        for g in compiled_graphs():
            f.write(f"===== {g.kind} graph: {g.report()}\n{g.gm.code}\n")
            for r in g.regions:
                f.write(f"{r}: {', '.join(map(str, r.ops))}\n")
                for n in r.region.nodes:          # each node with its arguments
                    f.write(f"    {n.format_node()}\n")
    print(f"graphs written to {path}")


if __name__ == "__main__":
    sys.exit(main())
