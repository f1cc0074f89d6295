"""The torch.compile backend's regions on disk: a new process skips lowering, segmenting and
planning a region it has seen (runtime/plan_store.py does the pickling and the restoring).

One entry per region form: the key is sha256 over the region's canonical form (`lower.region_key`:
its ops and their arguments and constants, the layout facts of its inputs, what its SymInts
resolve to) and `plan_store.environment` (pyfuser's source hash, Python and torch versions, the
executor mode, the GPU's name, arch and SM count or the interpreter's arch, the `PYFUSER_*`
variables). The entry holds the LoweredRegion (its Fusion), the Fusion's segmentation and the
plans its kernels were given when the graph was compiled (`FusedRegion.prepare`, from the FX
example values); the CUBINs stay in the CUBIN cache, keyed by their source, and are read in the
background when the entry is restored.

`load(region, rkey, symplan)` returns the LoweredRegion or None. An entry is refused (logged at
INFO with the reason, deleted, the region lowered again and the entry rewritten) when it does not
unpickle, was written for another region form (its full canonical form is stored beside the
key and compared), or does not fit the region: the Fusion's tensor inputs (dtype, rank), scalar
inputs and outputs (dtype, rank) are checked against the region's example values; damaged files
are refused by the disk cache's checksum first. What a stored plan decides is keyed by the
executor's signature of the real inputs at run time, as for a plan made in this process, so a
region run with other layout facts plans its own kernels. `store(region, lowered, ...)` writes
it once the region is prepared. Switches: `PYFUSER_DISABLE_PLAN_CACHE=1` or
`PYFUSER_DISABLE_DISK_CACHE=1` (no reads, no writes); `PYFUSER_DUMP` set (planning dumps show).
`stats` counts loads (`hits`, `misses`, `refused`), `stores` and `unpicklable` regions.
"""
from __future__ import annotations

import logging
import os

import torch

from ...ir.fusion import Fusion
from ...ir.tensor import TensorView
from ...runtime import plan_store
from .meta import meta

log = logging.getLogger("pyfuser")
NAME = "fx-region"
stats = plan_store.stats


def region_target(region):
    """(executor mode, CUDA device or None) the region's Fusion will run with."""
    for x in list(region.inputs) + list(region.outputs):
        v = meta(x)
        if isinstance(v, torch.Tensor) and v.device.type == "cuda":
            return "cuda", v.device
    return os.environ.get("PYFUSER_CPU_EXECUTOR") or "interpret", None


def arch_of(mode: str, device):
    if mode != "cuda" or os.environ.get("PYFUSER_ARCH"):
        return None                            # the executor's default (nvrtc.default_arch)
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _key(rkey, symplan, mode, device) -> str:
    return plan_store.make_key(("fx-region", rkey, symplan), mode, device)


def load(region, rkey, symplan):
    """The LoweredRegion stored for this region (restored: segmentation and plans), or None."""
    mode, device = region_target(region)
    if mode not in ("cuda", "interpret") or not plan_store.enabled():
        return None
    try:
        key = _key(rkey, symplan, mode, device)
    except Exception as e:  # noqa: BLE001 - no key (a device query failed): no cache
        log.debug("pyfuser plan cache: no key for a region: %s", e)
        return None
    data = plan_store.load(key, NAME)
    if data is None:
        return None
    try:
        entry = plan_store.loads(data)
        why = _misfit(entry, region, rkey, symplan, mode)
        if not why:
            lowered = entry["lowered"]
            lowered.out_layouts = [_layout(meta(o)) for o in region.outputs]
            lowered.store_as = None
            plan_store.restore(entry["snapshot"], arch_of(mode, device))
    except Exception as e:  # noqa: BLE001 - anything wrong with the payload: lower again
        why = f"it does not load: {type(e).__name__}: {e}"
    if why:
        stats["refused"] += 1
        log.info("pyfuser plan cache: entry %s refused (%s); the region is lowered again", key, why)
        plan_store.remove(key)
        return None
    return lowered


def store(region, lowered, rkey, symplan) -> bool:
    """Write the region's entry (after `FusedRegion.prepare` planned its kernels)."""
    mode, device = region_target(region)
    if mode not in ("cuda", "interpret") or not plan_store.enabled():
        return False
    try:
        key = _key(rkey, symplan, mode, device)
        entry = {"format": plan_store.FORMAT, "rkey": repr(rkey), "lowered": lowered,
                 "snapshot": plan_store.snapshot(lowered.fusion)}
        data = plan_store.dumps(entry)
    except Exception as e:  # noqa: BLE001 - not storable: the next process lowers it again
        stats["unpicklable"] += 1
        log.debug("pyfuser plan cache: a region is not stored: %s: %s", type(e).__name__, e)
        return False
    return plan_store.store(key, data, NAME)


def _layout(v):
    from .meta import layout
    return layout(v) if isinstance(v, torch.Tensor) else (None, False)


def _misfit(entry, region, rkey, symplan, mode) -> str:
    """Why a loaded entry does not fit this region ('' when it does)."""
    from .lower import LoweredRegion
    if not isinstance(entry, dict) or entry.get("format") != plan_store.FORMAT:
        return "another format"
    if entry.get("rkey") != repr(rkey):
        return "written for another region"
    lw, snap = entry.get("lowered"), entry.get("snapshot")
    if not isinstance(lw, LoweredRegion) or not isinstance(lw.fusion, Fusion) or \
            not isinstance(snap, dict) or snap.get("fusion") is not lw.fusion or \
            (snap.get("sf") is not None and snap["sf"].fusion is not lw.fusion):
        return "not a lowered region"
    f = lw.fusion
    tensors = [x for k, x in enumerate(region.inputs) if symplan[k] is None]
    scalars = [k for k, p in enumerate(symplan) if p is not None and p[0] != "extent"]
    if lw.scalar_inputs != scalars or lw.n_tensor_inputs != len(tensors) or \
            len(f.inputs) != len(tensors) + len(scalars):
        return "other inputs"
    for v, x in zip(f.inputs, tensors):
        m = meta(x)
        if not isinstance(v, TensorView) or v.dtype.torch != m.dtype or v.ndim != m.dim():
            return f"input {x.name}: another dtype or rank"
    if len(lw.outputs) != len(region.outputs):
        return "other outputs"
    for k, o in zip(lw.outputs, region.outputs):
        m = meta(o)
        if not (0 <= k < len(f.outputs)) or (isinstance(m, torch.Tensor) and (
                f.outputs[k].dtype.torch != m.dtype or f.outputs[k].ndim != m.dim())):
            return f"output {o.name}: another dtype or rank"
    fusions = snap.get("fusions") or []
    for i, m, sig, plan in snap.get("plans", []):
        if not (0 <= i < len(fusions)) or m != mode or not isinstance(sig, tuple) or \
                not isinstance(getattr(getattr(plan, "kernel", None), "source", None), str):
            return "a malformed plan"
    return ""
