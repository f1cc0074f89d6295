"""Python's cyclic garbage collector paused while pyfuser compiles, with `PYFUSER_GC_PAUSE=1`
(off by default: measured, below).

A compile makes many objects that live until it ends (FX nodes, fake tensors, Fusions, plans),
so the collector's automatic passes keep firing during it and each full pass walks every object
of the process (torch's and the model's modules included) without freeing much. Measured on the
CPU machine (eighteenth session): within a warm start of the test corpus' Llama through the
graph cache, the cache load and compile of its graphs took 0.89-0.99 s of the main thread with
the collector on, 0.33-0.38 s paused. But the passes move rather than go: the first calls'
whole time (bench/models.py's cold_s / warm_s, three runs each way, alternating) fell for Llama
(cold 8.51 -> 8.05 s, warm 2.53 -> 2.29 s) and not for GPT-2 (cold 8.72 -> 9.44 s, warm 5.38 ->
5.40 s; three Dynamo graphs; why was not looked into); on an H200 (bench/models.py, one run
each) Llama 3.37 -> 3.38 s and GPT-2 5.38 -> 6.27 s warm. So the collector is left alone unless
asked.

`paused()` disables the collector for the `with` block when `PYFUSER_GC_PAUSE=1` and restores
its state after (nested blocks: only the outermost turns it back on; a collector the program
had turned off stays off). Nothing is freed late that reference counting frees: only cycles
wait, until the collector's next pass after the block.
"""
from __future__ import annotations

import contextlib
import gc
import os


@contextlib.contextmanager
def paused():
    pause = gc.isenabled() and os.environ.get("PYFUSER_GC_PAUSE") == "1"
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()
