"""Python's cyclic garbage collector paused while pyfuser compiles.

A compile makes many objects that live until it ends (FX nodes, fake tensors, Fusions, plans),
so the collector's automatic passes keep firing during it and each full pass walks every object
of the process (torch's and the model's modules included) without freeing much. Measured on the
CPU machine (a warm start of the test corpus' Llama through the graph cache): the cache load and
compile of its graphs took 0.89-0.99 s of the main thread with the collector on, 0.33-0.38 s
paused.

`paused()` disables the collector for the `with` block and restores its state after (nested
blocks: only the outermost turns it back on; a collector the program had turned off stays off).
Nothing is freed late that reference counting frees: only cycles wait, until the collector's
next pass after the block (Dynamo runs a young-generation collection after each frame it
compiles). `PYFUSER_GC_PAUSE=0` leaves the collector alone (A/B timing).
"""
from __future__ import annotations

import contextlib
import gc
import os


@contextlib.contextmanager
def paused():
    pause = gc.isenabled() and os.environ.get("PYFUSER_GC_PAUSE") != "0"
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()
