"""Mbarriers and pushes into other blocks' shared memory, in the CPU interpreter (a mixin of
Interpreter, beside interpreter_shared.SharedMemory, whose arrays and race records it shares).

Model, per block and mbarrier: the arrivals a phase (`count`, 0 before its MbarInit), the
arrivals still due in the current phase, the bytes still due (expected by MbarExpect, less those
pushed; below zero while pushes run ahead of the expectation, as on the GPU), the phases
completed, and whether the init has been published to the cluster (a whole ClusterSync after
it, or the wait half of one whose arrive came after it). Threads run in lockstep, so a phase
is complete when a wait finds no arrival and no byte due; a wait for a phase that is not
complete then would spin forever (every push it counts comes before it in program order:
kernel_ir.MbarWait).

Checked (KernelRaceError): a push to a block whose mbarrier is not initialised or not yet
published; an element pushed twice with no ClusterSync between (its receiver may not have read
it), or pushed while another thread's access since the last barrier is unordered with it (a
local read counts until a ClusterSync, or the wait of a split one whose arrive followed it: a
block's own __syncthreads does not order another block's push); a pushed element read before
the receiving block's wait for the phase that counted it (the element is `pending` until
then, as an async copy's); more bytes pushed than expected; a wait
that would never return, reached by part of a block; and, at the kernel's end, a push never
waited for (its block could exit while the push lands).
"""
from __future__ import annotations

import torch

from . import kernel_ir as K
from .interpreter_shared import KernelRaceError

PUSHED = -3           # _Shared.pending of a pushed element: PUSHED - the mbarrier's number


class _Mbar:
    __slots__ = ("code", "count", "due", "bytes_due", "phases", "released", "published")

    def __init__(self, code: int, nblocks: int):
        self.code = code
        self.count = torch.zeros(nblocks, dtype=torch.int64)
        self.due = torch.zeros(nblocks, dtype=torch.int64)
        self.bytes_due = torch.zeros(nblocks, dtype=torch.int64)
        self.phases = torch.zeros(nblocks, dtype=torch.int64)
        self.released = torch.zeros(nblocks, dtype=torch.bool)    # initialised before an arrive
        self.published = torch.zeros(nblocks, dtype=torch.bool)


class Mbarriers:
    """MbarInit / MbarExpect / PushRemote / MbarWait of Interpreter (module docstring)."""

    def _mbar(self, name: str) -> _Mbar:
        if name not in self.mbars:
            self.mbars[name] = _Mbar(len(self.mbars), self.nb)
        return self.mbars[name]

    def _blocks(self, sc):
        return self.block_of[self._rows(sc)]

    def mbar_init(self, s: K.MbarInit, sc) -> None:
        blocks = self._blocks(sc)
        if blocks.unique().numel() != blocks.numel():
            raise KernelRaceError(f"{self.k.name}: mbarrier {s.name} initialised by several "
                                  "threads of a block")
        m = self._mbar(s.name)
        m.count[blocks] = s.count
        m.due[blocks] = s.count
        m.bytes_due[blocks] = 0
        m.phases[blocks] = 0
        m.released[blocks] = False
        m.published[blocks] = False

    def mbar_cluster_sync(self, sc, phase: str) -> None:
        """A ClusterSync by the active threads: mbarriers their blocks initialised before it
        (before its arrive, for a split one) may now take pushes from the cluster."""
        blocks = self._blocks(sc).unique()
        for m in self.mbars.values():
            if phase == "arrive":
                m.released[blocks] = m.count[blocks] > 0
            elif phase == "wait":
                m.published[blocks] |= m.released[blocks]
            else:
                m.published[blocks] |= m.count[blocks] > 0

    def _initialised(self, m: _Mbar, name: str, blocks) -> None:
        if bool((m.count[blocks] == 0).any()):
            raise KernelRaceError(f"{self.k.name}: mbarrier {name} used before its MbarInit")

    def mbar_expect(self, s: K.MbarExpect, sc) -> None:
        m = self._mbar(s.name)
        blocks = self._blocks(sc)
        self._initialised(m, s.name, blocks)
        n = torch.bincount(blocks, minlength=self.nb)
        m.due -= n
        m.bytes_due += n * s.nbytes
        if bool((m.due < 0).any()):
            raise KernelRaceError(f"{self.k.name}: more arrivals on mbarrier {s.name} than its "
                                  "phase counts")

    def push(self, s: K.PushRemote, sc) -> None:
        m = self._mbar(s.mbar)
        sh, key, rid = self._shared_key(s.dst, s.index, sc, s.rank)
        dest = key[0].reshape(-1)
        self._initialised(m, s.mbar, dest)
        if not bool(m.published[dest].all()):
            raise KernelRaceError(f"{self.k.name}: a push to mbarrier {s.mbar} of a block before "
                                  "its init was published by a cluster barrier")
        lin = torch.arange(sh.writer.numel()).view(sh.writer.shape)[key].reshape(-1)
        if lin.unique().numel() != lin.numel():
            raise KernelRaceError(f"{self.k.name}: two pushes to one element of shared {s.dst} "
                                  "in the same statement")
        w, r, cw, rr = sh.writer[key], sh.reader[key], sh.cwriter[key], sh.rreader[key]
        if bool((cw != -1).any()):
            raise KernelRaceError(f"{self.k.name}: shared {s.dst} pushed to after another write "
                                  "with no cluster barrier between (its receiver may not have "
                                  "read it)")
        cr = sh.creader[key]
        bad = ((w != -1) & (w != rid)) | ((r != -1) & (r != rid)) | ((rr != -1) & (rr != rid)) | \
            ((cr != -1) & (cr != rid))
        if bool(bad.any()):
            raise KernelRaceError(f"{self.k.name}: shared {s.dst} pushed to while another "
                                  "thread's access since the last barrier is unordered with it")
        val = self.ev(s.value, sc)
        if isinstance(val, torch.Tensor):
            val = val.to(sh.data.dtype).expand(key[0].shape) if val.dim() else val.item()
        sh.data[key] = val
        sh.writer[key] = rid
        sh.cwriter[key] = rid
        sh.wstamp[key] = self._arrives(key)      # a split barrier's wait orders it only if
        sh.pending[key] = PUSHED - m.code        # it came before the arrive
        m.bytes_due -= torch.bincount(dest, minlength=self.nb) * s.dtype.itemsize
        done = (m.due == 0) & (m.bytes_due < 0)
        if bool(done.any()):
            raise KernelRaceError(f"{self.k.name}: more bytes pushed to mbarrier {s.mbar} than "
                                  "its phase expects")

    def mbar_wait(self, s: K.MbarWait, sc) -> None:
        m = self._mbar(s.name)
        rows = self._rows(sc)
        blocks = self.block_of[rows]
        counts = torch.bincount(blocks, minlength=self.nb)
        if bool(((counts != 0) & (counts != self.T)).any()):
            raise KernelRaceError(f"{self.k.name}: a wait on mbarrier {s.name} reached by part "
                                  "of a block")
        self._initialised(m, s.name, blocks)
        here = counts == self.T
        complete = here & (m.due == 0) & (m.bytes_due == 0)
        if bool(complete.any()):
            m.phases[complete] += 1
            m.due[complete] = m.count[complete]
            for sh in self.shared.values():
                shape = (-1,) + (1,) * (sh.pending.dim() - 1)
                landed = complete.view(shape) & (sh.pending == PUSHED - m.code)
                sh.pending[landed] = -1
                sh.writer[landed] = -1
        parity = self.ev(s.parity, sc)
        parity = parity if isinstance(parity, torch.Tensor) else torch.full_like(rows, int(parity))
        if bool(((m.phases[blocks] % 2) == parity.reshape(-1)).any()):
            raise KernelRaceError(f"{self.k.name}: a wait on mbarrier {s.name} for a phase that "
                                  "never completes (an arrival or pushed bytes missing)")

    def check_pushes_landed(self) -> None:
        """At the kernel's end: every push was waited for by its receiver."""
        for name, sh in self.shared.items():
            if bool((sh.pending <= PUSHED).any()):
                raise KernelRaceError(f"{self.k.name}: a push into shared {name} never waited "
                                      "for (its block may exit first)")
