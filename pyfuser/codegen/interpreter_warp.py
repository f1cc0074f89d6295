"""Warp-wide operations in the CPU interpreter (a mixin of Interpreter): shuffles and ballots,
each checked to be reached by whole warps (a `KernelRaceError` otherwise: on a GPU the missing
lanes' values would be undefined).

Thread rows are the interpreter's: row r is thread r % T of its block, so the 32 rows of a warp
are neighbours and a lane is a row modulo 32 (T a multiple of 32).
"""
from __future__ import annotations

import torch

from . import kernel_ir as K
from .interpreter_shared import KernelRaceError

WARP = 32


class WarpOps:
    def _whole_warps(self, sc, what: str):
        """The active thread rows, checked to make whole warps."""
        rows = torch.arange(self.P) if sc.sel is None else sc.sel
        counts = torch.bincount(rows // WARP, minlength=-(-self.P // WARP))
        assert self.T % WARP == 0, f"{what}s need whole warps"
        if bool(((counts != 0) & (counts != WARP)).any()):
            raise KernelRaceError(f"{self.k.name}: a {what} reached by part of a warp")
        return rows

    def ballot(self, x: K.Ballot, sc):
        """Per active thread, the mask of its warp's lanes whose predicate holds."""
        rows = self._whole_warps(sc, "warp ballot")
        pred = self.ev(x.pred, sc)
        n = rows.shape[0]
        pred = pred.reshape(-1) if isinstance(pred, torch.Tensor) else torch.full((n,), bool(pred))
        bits = torch.zeros(self.P, dtype=torch.int64)
        bits[rows] = pred.expand(n).to(torch.int64) << (rows % WARP)
        masks = bits.view(-1, WARP).sum(1)
        return masks[rows // WARP]

    def shfl(self, x: K.Shfl, sc):
        val = self.ev(x.value, sc)
        n = sc.count(self.P)
        if not isinstance(val, torch.Tensor) or val.dim() == 0:
            return val                           # the same in every lane
        rows = self._whole_warps(sc, "warp shuffle")
        full = torch.zeros((self.P, *val.shape[1:]), dtype=val.dtype)
        full[rows] = val.expand(n, *val.shape[1:]) if val.shape[0] != n else val
        return full[rows ^ x.lane_xor]

