"""Shared memory of the CPU interpreter (interpreter.py) and its race checks: per array, every
block's elements with who wrote and who read each since the last barrier, so that a kernel whose
result would depend on the order its threads run in fails with a `KernelRaceError`.

A mixin of Interpreter, which provides `shared` ({name: _Shared}), `block_of` (each thread row's
block in the chunk), `P` / `T` / `nb` (threads in the chunk, threads a block, blocks) and `ev`.
Checked: a shared element written by one thread and read or written by another with no `Sync`
(or, across a cluster's blocks, no `ClusterSync`) between; two threads writing one element in one
statement; a barrier reached by part of a block or cluster; an element an async copy writes read
before its thread's `AsyncWait`. A split cluster barrier (`ClusterSync("arrive")`, later
`ClusterSync("wait")`) orders only what came before the arrive before what comes after the wait:
each record carries the cluster's arrive count when it was made (`wstamp` / `rstamp`), and the
wait clears only records older than the last arrive; arrive and wait must alternate.
"""
from __future__ import annotations

import torch

from . import kernel_ir as K


class KernelRaceError(AssertionError):
    """The kernel's result would depend on the order threads run in (a missing barrier)."""

class _Shared:
    """One shared-memory array of every block of the chunk, with its race bookkeeping: per
    element the thread (row) that wrote it and the one that read it since the block's last Sync
    (-1 none, -2 several readers); and, for other blocks of a cluster, who wrote it and who read
    it remotely since the last ClusterSync, and who read it locally since then (a push, a
    remote write, is ordered after a local read by a cluster barrier only); the thread whose
    async copy to it has not been waited for (-1 none); and the cluster's arrive count when the
    write / the reads were recorded (split cluster barriers)."""
    __slots__ = ("data", "writer", "reader", "cwriter", "rreader", "creader", "pending", "wstamp",
                 "rstamp")

    def __init__(self, nblocks, dims, dtype):
        self.data = torch.zeros((nblocks, *dims), dtype=dtype)
        self.writer = torch.full((nblocks, *dims), -1, dtype=torch.int64)
        self.reader = torch.full((nblocks, *dims), -1, dtype=torch.int64)
        self.cwriter = torch.full((nblocks, *dims), -1, dtype=torch.int64)
        self.rreader = torch.full((nblocks, *dims), -1, dtype=torch.int64)
        self.creader = torch.full((nblocks, *dims), -1, dtype=torch.int64)   # local reads since
        #                                     the last ClusterSync (a push must come after one)
        self.pending = torch.full((nblocks, *dims), -1, dtype=torch.int64)
        self.wstamp = torch.zeros((nblocks, *dims), dtype=torch.int64)
        self.rstamp = torch.zeros((nblocks, *dims), dtype=torch.int64)


class SharedMemory:
    """Shared arrays (per-thread indices) and barriers of Interpreter (module docstring)."""

    def _shared_key(self, name, index, sc, rank=None):
        """(the _Shared, advanced-index key, thread row of each element): every index broadcast
        with the block of each active thread ([n] or, inside a lanes loop, [n, V]); with `rank`,
        the block of that rank in the thread's cluster instead."""
        sh = self.shared[name]
        rows = torch.arange(self.P) if sc.sel is None else sc.sel
        idx = [self.ev(i, sc) for i in index]
        two_d = any(isinstance(v, torch.Tensor) and v.dim() == 2 for v in idx)
        blk, rid = self.block_of[rows], rows
        if rank is not None:
            r = self.ev(rank, sc)
            blk = blk - sc.env["cluster_rank"].view(-1) + (r.view(-1) if isinstance(r, torch.Tensor) else int(r))
        if two_d:
            blk, rid = blk.unsqueeze(1), rid.unsqueeze(1)
        idx = [v if isinstance(v, torch.Tensor) else torch.tensor(int(v)) for v in idx]
        key = torch.broadcast_tensors(blk, *idx)
        return sh, tuple(key), torch.broadcast_tensors(rid, key[0])[0]

    def _remote_read(self, x: K.RemoteRef, sc):
        sh, key, rid = self._shared_key(x.name, x.index, sc, x.rank)
        w = sh.cwriter[key]
        bad = (w != -1) & (w != rid)
        if bool(bad.any()):
            raise KernelRaceError(f"{self.k.name}: shared {x.name} of another block read by thread "
                                  f"{int(rid[bad][0])} after thread {int(w[bad][0])} wrote it, with "
                                  "no cluster barrier between")
        self._mark_readers(sh.rreader, key, rid)
        sh.rstamp[key] = self._arrives(key)
        return sh.data[key]

    def _arrives(self, key):
        """The arrive count of the cluster of each element's block (key[0])."""
        return self.cluster_arrives[key[0] // self.k.cluster]

    def _shared_read(self, name, index, sc):
        sh, key, rid = self._shared_key(name, index, sc)
        if bool((sh.pending[key] != -1).any()):
            raise KernelRaceError(f"{self.k.name}: shared {name} read before the async copy "
                                  "or push writing it was waited for (no AsyncWait / MbarWait)")
        w = sh.writer[key]
        bad = (w != -1) & (w != rid)
        if bool(bad.any()):
            raise KernelRaceError(f"{self.k.name}: shared {name} read by thread {int(rid[bad][0])} "
                                  f"after thread {int(w[bad][0])} wrote it, with no __syncthreads between")
        self._mark_readers(sh.reader, key, rid)
        self._mark_readers(sh.creader, key, rid)
        sh.rstamp[key] = self._arrives(key)
        return sh.data[key]

    @staticmethod
    def _mark_readers(readers, key, rid):
        """Record thread rows `rid` as readers of `readers`[key] (-2 once several threads)."""
        flat = torch.zeros_like(readers).view(-1)
        lin = torch.arange(flat.numel()).view(readers.shape)[key].reshape(-1)
        r = rid.reshape(-1)
        lo = torch.full_like(flat, 2 ** 62).scatter_reduce(0, lin, r, "amin")
        hi = torch.full_like(flat, -1).scatter_reduce(0, lin, r, "amax")
        prev = readers.view(-1)
        touched = hi >= 0
        one = lo == hi
        new = torch.where(one & ((prev == -1) | (prev == lo)), lo, torch.full_like(prev, -2))
        prev[touched] = new[touched]

    def _shared_write(self, name, index, sc, value, pending=False):
        sh, key, rid = self._shared_key(name, index, sc)
        lin = torch.arange(sh.writer.numel()).view(sh.writer.shape)[key].reshape(-1)
        if lin.unique().numel() != lin.numel():
            raise KernelRaceError(f"{self.k.name}: two threads write one element of shared {name} "
                                  "in the same statement")
        w, r, rr = sh.writer[key], sh.reader[key], sh.rreader[key]
        bad = ((w != -1) & (w != rid)) | ((r != -1) & (r != rid)) | ((rr != -1) & (rr != rid))
        if bool(bad.any()):
            raise KernelRaceError(f"{self.k.name}: shared {name} written by thread "
                                  f"{int(rid[bad][0])} while another thread's access since the last "
                                  "__syncthreads is unordered with it")
        sh.writer[key] = rid
        sh.cwriter[key] = rid
        sh.pending[key] = rid if pending else -1
        sh.wstamp[key] = self._arrives(key)
        if isinstance(value, torch.Tensor):
            value = value.to(sh.data.dtype).expand(key[0].shape) if value.dim() else value.item()
        sh.data[key] = value

    def sync(self, sc) -> None:
        if sc.sel is not None:
            counts = torch.bincount(self.block_of[sc.sel], minlength=self.nb)
            if bool(((counts != 0) & (counts != self.T)).any()):
                raise KernelRaceError(f"{self.k.name}: __syncthreads reached by part of a block")
            blocks = counts == self.T
        else:
            blocks = torch.ones(self.nb, dtype=torch.bool)
        for sh in self.shared.values():
            sh.writer[blocks] = -1
            sh.reader[blocks] = -1

    def async_wait(self, sc) -> None:
        """The active threads' async copies have landed."""
        rows = torch.arange(self.P) if sc.sel is None else sc.sel
        for sh in self.shared.values():
            if bool((sh.pending != -1).any()):
                sh.pending[torch.isin(sh.pending, rows)] = -1

    def cluster_sync(self, sc, phase: str = "sync") -> None:
        """A cluster barrier (phase "sync"), or its "arrive" or "wait" half, reached by the
        active threads: whole clusters only; arrive and wait alternate."""
        C = self.k.cluster
        rows = torch.arange(self.P) if sc.sel is None else sc.sel
        counts = torch.bincount(self.block_of[rows] // C, minlength=-(-self.nb // C))
        if bool(((counts != 0) & (counts != self.T * C)).any()):
            raise KernelRaceError(f"{self.k.name}: a cluster barrier reached by part of a cluster")
        clusters = counts == self.T * C
        open_ = self.cluster_open[clusters]
        if bool(open_.any()) if phase != "wait" else not bool(open_.all()):
            raise KernelRaceError(f"{self.k.name}: a cluster barrier's {phase} where "
                                  + ("an arrive is still to be waited for" if phase != "wait"
                                     else "no arrive came before"))
        if phase == "arrive":
            self.cluster_arrives[clusters] += 1
            self.cluster_open[clusters] = True
            return
        blocks = clusters.repeat_interleave(C)[:self.nb]
        if phase == "wait":          # only what came before the arrive is ordered before
            self.cluster_open[clusters] = False
            arrives = self.cluster_arrives.repeat_interleave(C)[:self.nb]
            for sh in self.shared.values():
                shape = (-1,) + (1,) * (sh.writer.dim() - 1)
                old_w = blocks.view(shape) & (sh.wstamp < arrives.view(shape))
                old_r = blocks.view(shape) & (sh.rstamp < arrives.view(shape))
                for arr, old in ((sh.writer, old_w), (sh.cwriter, old_w), (sh.reader, old_r),
                                 (sh.rreader, old_r), (sh.creader, old_r)):
                    arr[old] = -1
            return
        for sh in self.shared.values():
            for arr in (sh.writer, sh.reader, sh.cwriter, sh.rreader, sh.creader):
                arr[blocks] = -1
