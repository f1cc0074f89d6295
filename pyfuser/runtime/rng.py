"""The seed and offset of a launch that draws random numbers (ir/philox.py's stream).

`launch_state(device, increment) -> (seed, offset)` is called once per launch (kernel or
evaluator run) of a fusion with random ops, and reserves `increment` (4 per random op) of the
generator's offset:
- CUDA: PyTorch's default CUDA generator of that device, as torch's own Philox-based kernels
  use it: its seed (`initial_seed()`) and its offset (`get_offset()`), which is then advanced
  (`set_offset`); so `torch.manual_seed` / `torch.cuda.manual_seed` reproduce a run, and eager
  random ops between pyfuser's never reuse a counter of theirs;
- CPU: PyTorch's CPU generator (a Mersenne twister, which has no offset) draws a fresh 64-bit
  seed (two 32-bit draws, so it advances as one small `torch.randint` would); the offset is 0.
  `torch.manual_seed` reproduces a run here too.

`fixed(seed, offset=0)` (a context manager) makes every launch draw from that seed, its offset
advancing from `offset` by each launch's increment, on any device: tests use it to compare the
CPU interpreter's bits with the GPU kernel's.

The seed is passed to kernels as int64_t (its bit pattern: values of 2^63 and up are negative).
"""
from __future__ import annotations

import contextlib

import torch

_fixed: list = []          # stack of [seed, next offset]


def _signed64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def launch_state(device, increment: int) -> tuple[int, int]:
    if _fixed:
        state = _fixed[-1]
        seed, offset = state
        state[1] = offset + increment
        return _signed64(seed), offset
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_draw(torch.cuda.default_generators[index], increment)
    words = torch.randint(0, 1 << 32, (2,), dtype=torch.int64)
    return _signed64(int(words[0]) | (int(words[1]) << 32)), 0


def _cuda_draw(gen, increment: int) -> tuple[int, int]:
    offset = gen.get_offset()
    gen.set_offset(offset + increment)
    return _signed64(gen.initial_seed()), offset


def drawer(device, increment: int):
    """launch_state(device, increment) as a function of no arguments, for a launch replayed many
    times (the native runner's `draw`): a CUDA device's generator is looked up once (the same
    object for the process's life: manual_seed and set_rng_state change its state, not it), so
    a draw is its three calls (H200 host: 1.0 µs against 3.5 for launch_state)."""
    device = torch.device(device)
    if device.type != "cuda":
        return lambda: launch_state(device, increment)
    gen: list = []              # looked up at the first draw outside `fixed`

    def draw():
        if _fixed:
            return launch_state(device, increment)
        if not gen:
            index = device.index if device.index is not None else torch.cuda.current_device()
            gen.append(torch.cuda.default_generators[index])
        return _cuda_draw(gen[0], increment)
    return draw


def device_of(tensors):
    """The device a launch runs on: that of its first tensor (every one is on it)."""
    for t in tensors:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


@contextlib.contextmanager
def fixed(seed: int, offset: int = 0):
    _fixed.append([int(seed), int(offset)])
    try:
        yield
    finally:
        _fixed.pop()
