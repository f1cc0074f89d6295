"""Counting kernel launches on the CPU with a dispatch hook (no profiler, no GPU).

`count_eager(fn, *args)`: the aten ops `fn` dispatches that launch a kernel on a GPU: every op
that reaches the dispatcher except views (a schema whose result aliases an input without
writing it), allocations (`empty*`) and metadata-only ops. `count_fused(f, *args)`: the same
count for a pyfuser.jit callable, where a fusion group counts the kernels its fusion launches
(`last_run.kernels`) and the ops pyfuser runs inside groups (the CPU interpreter's) are not
counted; the ops outside groups count as in eager. Both run under torch.no_grad().
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

_NO_KERNEL = {"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like",
              "lift_fresh", "_local_scalar_dense", "_unsafe_view", "sym_size", "sym_stride",
              "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
              "set_", "resize_"}


def launches_kernel(func) -> bool:
    if func.__name__.split(".")[0] in _NO_KERNEL:
        return False
    for r in func._schema.returns:
        a = r.alias_info
        if a is not None and not a.is_write:
            return False                       # a view
    return True


class KernelCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches_kernel(func):
            self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def count_eager(fn, *args) -> tuple:
    """(kernels, the ops counted)."""
    with torch.no_grad(), KernelCounter() as c:
        fn(*args)
    return len(c.ops), c.ops


@contextlib.contextmanager
def _groups_uncounted():
    """Group calls run outside the counting mode (their fusion's kernels are counted)."""
    from pyfuser.frontend.torchscript.group_runner import GroupRunner
    run, fast = GroupRunner.run, GroupRunner.fast

    def quiet_run(self, *a, **k):
        with _disable_current_modes():
            return run(self, *a, **k)

    def quiet_fast(self, *a, **k):
        with _disable_current_modes():
            return fast(self, *a, **k)
    GroupRunner.run, GroupRunner.fast = quiet_run, quiet_fast
    try:
        yield
    finally:
        GroupRunner.run, GroupRunner.fast = run, fast


def count_fused(f, *args) -> tuple:
    """(kernels, the ops counted outside groups) of one call of a pyfuser.jit callable."""
    with torch.no_grad(), _groups_uncounted(), KernelCounter() as c:
        f(*args)
    stats = f.last_run
    assert stats.eager_groups == 0, stats.fallbacks
    return len(c.ops) + stats.kernels, c.ops
