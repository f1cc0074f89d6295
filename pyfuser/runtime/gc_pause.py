"""Python's cyclic garbage collector while pyfuser compiles: full passes deferred to the end.

A compile makes many objects that live until it ends (FX nodes, fake tensors, Fusions, plans,
the segmenter's copies of groups), so the collector's automatic passes keep firing during it.
The young generations' passes are cheap (they walk young objects) and free the compile's cyclic
garbage; a full pass walks every object of the process (0.5 M and more with torch, Dynamo and a
model: 0.2-0.4 s each on the CPU machine) and frees little. `paused()` is the scope a compile
runs in (the backend's call, a backward compiled at its first call, the TorchScript jit's first
call of a new signature); what it does there is `$PYFUSER_GC_PAUSE`:
- `defer` (the default): no full pass inside the scope (the oldest generation's threshold is
  raised, the thresholds restored after), young passes as usual. Measured on the CPU machine
  (twenty-fifth session, gc callbacks, ResNet-18's cold first calls): 5 full passes (1.5 s)
  -> 3 (0.9 s); a transformer's 3 full passes stay 3, moved after the compile (the process'
  heap grew by as much), 0.7-0.9 s either way.
- `1`: the collector disabled in the scope (the eighteenth session's pause: young garbage waits
  too, so more of it reaches the old generation; measured faster for some models' first calls,
  slower for others: docs/compile_backend.md).
- `0`: the collector left alone.

Invariants: only the outermost scope (over all threads) acts, and it restores exactly the state
it changed (a collector the program turned off stays off and is not touched); nothing reference
counting frees is freed late, only cycles in the oldest generation wait for the next full pass
after the scope.
"""
from __future__ import annotations

import contextlib
import gc
import os
import threading

_lock = threading.Lock()
_depth = 0                      # scopes open now, over all threads
DEFER_THRESHOLD = 1 << 30       # the oldest generation's threshold inside a deferring scope


def mode() -> str:
    """`$PYFUSER_GC_PAUSE`: "defer" (the default), "1" (pause) or "0" (off)."""
    value = os.environ.get("PYFUSER_GC_PAUSE", "defer")
    return value if value in ("0", "1") else "defer"


@contextlib.contextmanager
def paused():
    global _depth
    with _lock:
        outer = _depth == 0
        _depth += 1
    undo = None
    if outer and gc.isenabled():
        how = mode()
        if how == "1":
            gc.disable()
            undo = gc.enable
        elif how == "defer":
            saved = gc.get_threshold()
            gc.set_threshold(saved[0], saved[1], DEFER_THRESHOLD)
            undo = lambda: gc.set_threshold(*saved)  # noqa: E731
    try:
        yield
    finally:
        if undo is not None:
            undo()
        with _lock:
            _depth -= 1
