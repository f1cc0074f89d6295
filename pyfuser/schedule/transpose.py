"""The transpose scheduler: a copy whose input layout differs from its output's, made coalesced.

It takes a Fusion that is one `set` of a fusion input whose declared layout is permuted (the
segmenter gives it the kernel segment left when host segments turn `view -> permute` into a
strided view of the input: seed 002's `view, permute, set, view, view`), writing a row-major
output. Elementwise ops fused around the transpose are not handled yet (pointwise takes those).

`schedule(fusion, inputs) -> TransposeParams`, from the facts in the layout signature only:
1. size-1 axes are dropped (all of them but the last when every axis has size 1: one element
   is one row); neighbouring axes (in output order) whose input strides are
   contiguous (stride[a] == stride[b] * size[b]) are collapsed into groups;
2. `o` = the output's innermost group, `i` = the group with the smallest input stride that is
   not 0 (an expanded axis is a batch axis);
3. i != o ("tile"): blocks stage TILE x TILE tiles of (i, o) through shared memory (padded by one
   element against bank conflicts): reads run along i, writes along o, both coalesced;
   i == o ("rows"): rows are contiguous on both sides; each thread copies a vector of `vec`
   elements (the widest dividing the row, the other strides and the pointer alignment).
Remaining groups are batch axes, enumerated by the block index.
The fusion may take other tensors it does not read (the destination of AOTAutograd's functional
`copy(dst, src)`, whose shape and dtype only the lowering used): the kernel's tensors are the
fusion's tensor inputs then its output, so the copied input's position (`in_seg`) and the
output's (`out_seg`) are the plan's, never assumed to be 0 and 1.

Invariant: every decision reads only layout-signature facts (size-1 axes, stride order,
contiguity of neighbours, power-of-two divisors, pointer alignment, 64-bit indexing), so a plan
is valid for every input with the same signature.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import SchedulerError
from ..ir import exprs as E
from ..ir.tensor import TensorView
from . import cache_policy
from . import layout as L

TILE = 32
ROWS = 8                      # tile kernel block = (TILE, ROWS) threads
MIN_ROW_BYTES = 0             # rows of any length use the row kernel when i == o
ROW_BLOCK = 128               # rows kernel: threads per block
ROW_UNROLL = 8                # rows kernel: vectors per thread, all loaded before the stores
# (H200, seed 002 [64,128,12,64] f32, kernel alone, L2 flushed: 128 x 8 14.1-14.2 us in two
# runs; 256 x 4 14.5-15.0; 256 x 8 14.5-14.7; 256 x 1 15.0; the old grid-capped kernel 15.0)


def can_schedule(fusion) -> tuple[bool, str]:
    exprs = fusion.used_exprs()
    if len(exprs) != 1 or not isinstance(exprs[0], E.SetOp):
        return False, "not a single copy (set) of an input"
    e = exprs[0]
    inp = e.inputs[0]
    if not isinstance(inp, TensorView) or inp not in fusion.inputs or \
            fusion.outputs != [e.output]:
        return False, "the copy must read a fusion input and be the only output"
    if inp.dtype.is_complex:
        return False, f"complex dtype {inp.dtype.name}"
    if inp.stride_order is None or sorted(range(inp.ndim), key=lambda a: -inp.stride_order[a]) \
            == list(range(inp.ndim)):
        return False, "the input is not permuted (a plain copy is the pointwise scheduler's)"
    return True, ""


@dataclass
class TransposeParams:
    groups: list               # axis groups, output order (outer -> inner), size-1 axes dropped
    kind: str                  # "tile" or "rows" (or "empty": nothing to copy)
    i: int = 0                 # group with the smallest input stride
    o: int = 0                 # output inner group (the last)
    vec: int = 1
    index_type: str = "int"
    itemsize: int = 4
    tile: int = TILE
    block: int = ROW_BLOCK      # rows kernel: threads per block
    unroll: int = ROW_UNROLL    # rows kernel: vectors per thread
    reason: str = ""
    batch: list = field(default_factory=list)   # the other groups, outer -> inner
    load_cache: str = ""        # cache policies of the loads and stores (schedule/cache_policy.py)
    store_cache: str = ""
    in_seg: int = 0             # kernel tensor positions (tensor inputs, then the output) of the
    out_seg: int = 1            # copied input and of the output

    def as_dict(self) -> dict:
        return {"kind": self.kind, "groups": self.groups, "i": self.i, "o": self.o,
                "vec": self.vec, "index_type": self.index_type, "tile": self.tile,
                "block": self.block, "unroll": self.unroll, "load_cache": self.load_cache,
                "store_cache": self.store_cache, "in_seg": self.in_seg, "out_seg": self.out_seg}


def _collapse(sizes, strides) -> list[list[int]]:
    groups: list[list[int]] = []
    for a in range(len(sizes)):
        if sizes[a] == 1:
            continue
        if groups:
            prev = groups[-1][-1]
            if strides[prev] == strides[a] * sizes[a]:
                groups[-1].append(a)
                continue
        groups.append([a])
    return groups


def group_extents(groups, x) -> tuple[list[int], list[int]]:
    """(sizes, input strides) of the groups for tensor x."""
    sizes = [L.numel(x.shape[a] for a in g) for g in groups]
    return sizes, [x.stride(g[-1]) for g in groups]


def schedule(fusion, inputs) -> TransposeParams:
    ok, why = can_schedule(fusion)
    if not ok:
        raise SchedulerError(f"transpose scheduler: {why}")
    inp = fusion.used_exprs()[0].inputs[0]
    x = inputs[fusion.inputs.index(inp)]
    tensor_inputs = fusion.tensor_inputs()
    sizes, strides = tuple(x.shape), tuple(x.stride())
    groups = _collapse(sizes, strides)
    if not groups and x.numel() > 0:     # every axis has size 1: one element, one row of it
        groups = [[len(sizes) - 1]]
    p = TransposeParams(groups, "empty", itemsize=x.element_size(),
                        in_seg=tensor_inputs.index(inp), out_seg=len(tensor_inputs))
    p.index_type = "int64_t" if L.needs_int64([x], x.numel()) else "int"
    # streaming loads and stores: H200, bench/sweep.py cache, 2026-11-22, seed 002's rows copy:
    # back-to-back 14.4 us vs 15.4 plain in two runs; flushed-L2 timings level (+-0.6 us)
    p.load_cache, p.store_cache = cache_policy.choose("cs", "cs")
    if not groups or x.numel() == 0:
        return p
    o = len(groups) - 1
    # an expanded (stride 0) group is a batch axis: it is read again, not along (a repeat of
    # grouped-query attention's keys and values before a copy)
    moving = [g for g in range(len(groups)) if strides[groups[g][-1]] != 0] or [o]
    i = min(moving, key=lambda g: (strides[groups[g][-1]], -g))
    p.i, p.o = i, o
    p.batch = [g for g in range(len(groups)) if g not in (i, o)]
    if i == o:
        p.kind, p.vec = "rows", _vector_width(groups, sizes, strides, x)
        p.reason = "rows are contiguous on both sides"
        # tuning knobs (speed only): $PYFUSER_TR_BLOCK (<= 1024), $PYFUSER_TR_UNROLL
        b, u = os.environ.get("PYFUSER_TR_BLOCK"), os.environ.get("PYFUSER_TR_UNROLL")
        p.block = min(1024, int(b)) if b else p.block
        p.unroll = int(u) if u else p.unroll
    else:
        p.kind, p.reason = "tile", f"input inner group {i} != output inner group {o}"
    return p


def _vector_width(groups, sizes, strides, x) -> int:
    inner = groups[-1]
    if strides[inner[-1]] != 1:
        return 1
    size_p2 = 1
    for a in inner:
        size_p2 *= L.p2(sizes[a])
    vec = 16 // x.element_size()
    while vec > 1:
        if size_p2 % vec == 0 and L.p2(x.data_ptr()) % (vec * x.element_size()) == 0 and \
                all(L.p2(strides[g[-1]]) % vec == 0 for g in groups[:-1]):
            return vec
        vec //= 2
    return 1

