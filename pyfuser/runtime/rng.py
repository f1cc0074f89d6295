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

**CUDA graphs.** A kernel also takes `state`, a pointer to two int64 words in device memory, and
draws from (seed ^ state[0], offset + state[1]). Outside a capture it points at a per-device
buffer of zeros (`zero_state`), so the numbers are the host draw's. While `capturing(device)` is
active (runtime/graph_capture.py's Backend.capture, around the recorded run; per thread: a
capture records its own thread's launches), a launch of that thread on that device draws no
host state (the generator is not touched: the capture's host values are fixed
for every replay anyway): its seed is 0 and its offset the capture's running count, and `state`
points at the capture's own two words, which its first random launch fills with a captured
`torch.randint` from PyTorch's CUDA generator (graph-safe: each replay draws new words, and
`torch.manual_seed` reproduces a run of replays). So every replay draws new numbers, the
launches of one graph use disjoint counters, and the capture's words live as long as its
graph (`Capture.state`, held by the graph). A host-side draw that a graph cannot refresh (the
evaluator's random ops, which compute on the host's seed) raises `HostDrawInCapture`, which
fails the capture (the graph then runs uncaptured). A graph captured by other means (a user's
own `torch.cuda.graph` around pyfuser's random kernels) fails at their first launch: PyTorch's
generator refuses to advance its offset during a capture; that draw comes before anything is
allocated, so no buffer of ours lands in that graph's memory pool.
"""
from __future__ import annotations

import contextlib
import threading

import torch

_fixed: list = []          # stack of [seed, next offset]
_local = threading.local()  # .captures: device -> this thread's active Capture of that device
_zeros: dict = {}          # device -> its zero state (two int64 words)


class HostDrawInCapture(RuntimeError):
    """A host-seeded random draw inside a CUDA-graph capture (a replay would repeat it)."""


class Capture:
    """The random state of one CUDA-graph capture on `device` (module docstring)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.state = None          # the captured words, made by the first random launch
        self.offset = 0

    def reserve(self, increment: int) -> tuple[int, int]:
        if self.state is None:
            self.state = torch.randint(0, 1 << 62, (2,), dtype=torch.int64, device=self.device)
        offset = self.offset
        self.offset += increment
        return 0, offset


def _active() -> dict:
    """This thread's active captures (a capture records the launches of its own thread)."""
    caps = getattr(_local, "captures", None)
    if caps is None:
        caps = _local.captures = {}
    return caps


def _key(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


@contextlib.contextmanager
def capturing(device):
    """Launches on `device` draw graph-safe random numbers while this is active (module
    docstring); yields the Capture, whose `state` the captured graph must keep alive."""
    key = _key(device)
    cap = Capture(key)
    caps = _active()
    outer = caps.get(key)
    caps[key] = cap
    try:
        yield cap
    finally:
        if outer is None:
            del caps[key]
        else:
            caps[key] = outer


def zero_state(device) -> torch.Tensor:
    """The device's two zero words (made on first use, outside any capture: a capture's warm-up
    run launches every kernel first)."""
    key = _key(device)
    z = _zeros.get(key)
    if z is None:
        z = _zeros[key] = torch.zeros(2, dtype=torch.int64, device=key)
    return z


def state_tensor(device) -> torch.Tensor:
    """What a launch's `state` points at: the active capture's words, else zeros."""
    key = _key(device)
    cap = _active().get(key)
    if cap is not None and cap.state is not None:
        return cap.state
    return zero_state(key)


def state_ptr(device) -> int:
    return state_tensor(device).data_ptr()


def host_draw(device, increment: int) -> tuple[int, int]:
    """launch_state for a computation seeded on the host alone (the evaluator's random ops):
    refused inside a capture."""
    caps = _active()
    if caps and _key(device) in caps and not _fixed:
        raise HostDrawInCapture("random numbers seeded on the host inside a CUDA-graph capture "
                                "(a replay would repeat them)")
    return launch_state(device, increment)


def _signed64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def launch_state(device, increment: int) -> tuple[int, int]:
    if _fixed:
        state = _fixed[-1]
        seed, offset = state
        state[1] = offset + increment
        return _signed64(seed), offset
    caps = _active()
    if caps:
        cap = caps.get(_key(device))
        if cap is not None:
            return cap.reserve(increment)
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
    """(*launch_state(device, increment), state_ptr(device)) as a function of no arguments, for
    a launch replayed many times (the native runner's `draw`): a CUDA device's generator and zero
    state are looked up once (the same objects for the process's life: manual_seed and
    set_rng_state change the generator's state, not it), so a draw is its three calls (H200
    host: 1.0 µs against 3.5 for launch_state)."""
    device = torch.device(device)
    if device.type != "cuda":
        return lambda: (*launch_state(device, increment), 0)
    gen: list = []              # looked up at the first draw outside `fixed`

    def draw():
        if _fixed or _active():
            return (*launch_state(device, increment), state_ptr(device))
        if not gen:
            index = device.index if device.index is not None else torch.cuda.current_device()
            gen.append(torch.cuda.default_generators[index])
        drawn = _cuda_draw(gen[0], increment)    # first: inside a capture not ours it raises,
        if len(gen) == 1:                        # before zeros are made in that graph's pool
            gen.append(zero_state(device).data_ptr())
        return (*drawn, gen[1])
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
