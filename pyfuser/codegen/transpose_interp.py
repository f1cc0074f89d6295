"""CPU interpreter of the transpose kernels: the block-by-block algorithm, vectorized with torch.

It follows the CUDA of transpose_plan.py step by step, with every block of a chunk at once:
- "tile": per block the tile origin (o0, i0) and batch offsets from the block index, the load
  phase (thread x along the input-inner group, j along the output-inner one) into a padded
  shared tile [TILE][TILE + 1], then the store phase reading the tile transposed; out-of-range
  elements are masked exactly where the kernel's `if` skips them;
- "rows": per vector l its row and in-row offset, `vec` lanes copied per vector.
Loads and stores go through flat views of the real tensors' storage with the kernel's offsets, so
an indexing bug gives wrong results here as on a GPU.
"""
from __future__ import annotations

import torch

from ..schedule.transpose import TransposeParams, group_extents

BLOCKS_PER_CHUNK = 4096


def _flat(t: torch.Tensor) -> torch.Tensor:
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return t.as_strided((span,), (1,))


def _out_strides(gs) -> list[int]:
    os_ = [1] * len(gs)
    for g in range(len(gs) - 2, -1, -1):
        os_[g] = os_[g + 1] * gs[g + 1]
    return os_


def _decompose(r, groups, gs, strides):
    off = torch.zeros_like(r)
    for g in reversed(groups):
        off += (r % gs[g]) * strides[g]
        r = r // gs[g]
    return off


def run(p: TransposeParams, x: torch.Tensor, out: torch.Tensor) -> None:
    if p.kind == "empty" or x.numel() == 0:
        return
    gs, gt = group_extents(p.groups, x)
    src, dst = _flat(x), out.view(-1)
    if p.kind == "rows":
        _rows(p, gs, gt, src, dst)
    else:
        _tile(p, gs, gt, _out_strides(gs), src, dst)


def _row_offset(r, groups, gs, gt):
    """The kernel's row offset: inner groups by div and remainder, the outermost takes the rest."""
    off = torch.zeros_like(r)
    for k, g in enumerate(reversed(groups)):
        if k == len(groups) - 1:
            off += r * gt[g]
        else:
            q = r // gs[g]
            off += (r - q * gs[g]) * gt[g]
            r = q
    return off


def _rows(p, gs, gt, src, dst) -> None:
    V, o, U, B = p.vec, p.o, p.unroll, p.block
    nv = gs[o] // V
    outer = list(range(len(gs) - 1))
    total = nv
    for g in outer:
        total *= gs[g]
    nblk = -(-total // (U * B))
    lanes = torch.arange(V)
    u, tid = torch.arange(U)[:, None], torch.arange(B)[None, :]
    for start in range(0, nblk, BLOCKS_PER_CHUNK):
        blk = torch.arange(start, min(nblk, start + BLOCKS_PER_CHUNK))[:, None, None]
        l = ((blk * U + u) * B + tid).reshape(-1)    # [block, step u, thread]
        l = l[l < total]                              # the kernel's `if (l < total)`
        r = l // nv
        off = (l - r * nv) * V * gt[o] + _row_offset(r, outer, gs, gt)
        dst[(l[:, None] * V + lanes).reshape(-1)] = src[(off[:, None] + lanes * gt[o]).reshape(-1)]


def _tile(p, gs, gt, os_, src, dst) -> None:
    t, i, o = p.tile, p.i, p.o
    tiles_o, tiles_i = -(-gs[o] // t), -(-gs[i] // t)
    nblk = tiles_o * tiles_i
    for g in p.batch:
        nblk *= gs[g]
    ar = torch.arange(t)
    j, tx = ar[:, None], ar[None, :]                  # [j, threadIdx.x] of one block
    for start in range(0, nblk, BLOCKS_PER_CHUNK):
        blk = torch.arange(start, min(nblk, start + BLOCKS_PER_CHUNK))
        r = blk // tiles_o
        o0 = ((blk % tiles_o) * t)[:, None, None]
        i0 = ((r % tiles_i) * t)[:, None, None]
        r = r // tiles_i
        ib = _decompose(r, p.batch, gs, gt)[:, None, None]
        ob = _decompose(r, p.batch, gs, os_)[:, None, None]
        tile = torch.zeros((len(blk), t, t + 1), dtype=src.dtype)
        ii, oo = i0 + tx, o0 + j                      # load phase: tile[j][x] = in[...]
        m = (ii < gs[i]) & (oo < gs[o])
        vals = src[(ib + ii * gt[i] + oo * gt[o]).masked_fill(~m, 0)]
        tile[:, :, :t] = torch.where(m, vals, tile[:, :, :t])
        oo, ii = o0 + tx, i0 + j                      # store phase: out[...] = tile[x][j]
        m = (ii < gs[i]) & (oo < gs[o])
        read = tile[:, :, :t].transpose(1, 2)         # read[b, j, x] = tile[b, x, j]
        dst[(ob + ii * os_[i] + oo)[m]] = read[m]
