"""Timing for bench/models.py: `time_samples` / `time_ms` (CUDA events on the GPU, the wall
clock on the CPU, after warm-up calls) and interleaved timing (`--rounds R`): the modes of one
model and dtype timed in alternation, so that a host whose speed drifts during the run
(bfloat16 steps are bound by the host's Python and launch time, and a shared host's speed moves
by tens of percent within minutes) slows every mode alike instead of whichever mode's block it
fell on.

`interleaved_times(case, modes, rounds, reps, device)`: after bench/models.py's rows of that
model and dtype (cold compile, check, blocked timing), each mode's model is compiled again (from
whatever caches the last row left: the cache directories are that row's, so Inductor compiles
about as long as cold; no reset in between, so all of them stay compiled at once; Dynamo's
per-code-object cache limit is raised, as the modes share the model's code objects and a limit
hit would silently run a frame eagerly), warmed up, and then timed in `rounds` rounds: per
round every mode in turn (the order rotated each round) runs `reps // rounds` forwards, then
every mode its training steps. Returns per mode the median over all its timed calls and the
spread of its per-round medians (`fwd_spread`: "min-max" ms), which says how far the host moved.

Invariant: the timed calls are the same calls bench/models.py times (Case.forward /
Case.train_step after warm-up), with CUDA events on the GPU; nothing here changes a model.
"""
from __future__ import annotations

import statistics
import time


def sync(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def time_samples(fn, device: str, reps: int, warmup: int) -> list:
    """The ms of each of `reps` calls after `warmup` calls: CUDA events around each call on the
    GPU (then synchronized), the wall clock on the CPU."""
    import torch
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def time_ms(fn, device: str, reps: int, warmup: int) -> float:
    """Median ms of `reps` calls after `warmup` calls (time_samples)."""
    return statistics.median(time_samples(fn, device, reps, warmup))


def _cache_limits(torch) -> None:
    cfg = torch._dynamo.config
    cfg.cache_size_limit = max(cfg.cache_size_limit, 64)
    if hasattr(cfg, "accumulated_cache_size_limit"):
        cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 1024)


def interleaved_times(case, modes, rounds: int, reps: int, device: str) -> dict:
    """{mode: {"fwd_ms", "train_ms", "fwd_spread", "train_spread"}} as the module docstring
    says."""
    import torch
    _cache_limits(torch)
    made = {}
    for mode in modes:
        model, fn, opt = case.make(mode)
        case.forward(model, fn)           # compile (from the caches) and warm up both steps
        case.train_step(model, fn, opt)
        made[mode] = (model, fn, opt)
    per = max(1, reps // max(1, rounds))
    out = {m: {} for m in modes}
    for step in ("fwd", "train"):
        times = {m: [] for m in modes}
        medians = {m: [] for m in modes}
        for r in range(rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                model, fn, opt = made[mode]
                call = (lambda: case.forward(model, fn)) if step == "fwd" else \
                    (lambda: case.train_step(model, fn, opt))
                got = time_samples(call, device, per, 1)
                times[mode] += got
                medians[mode].append(statistics.median(got))
        for mode in modes:
            out[mode][f"{step}_ms"] = statistics.median(times[mode])
            out[mode][f"{step}_spread"] = f"{min(medians[mode]):.2f}-{max(medians[mode]):.2f}"
    del made
    return out
