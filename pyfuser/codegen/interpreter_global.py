"""Global-memory race check of the CPU interpreter (interpreter.py), switched on by
PYFUSER_INTERP_RACECHECK=1 (or `Interpreter(..., racecheck=True)`; the CPU tests switch it on
in tests/conftest.py).

Why it is needed: the interpreter runs a chunk's threads statement by statement in lockstep and
the chunks one after the other, so every load of a statement comes before every store of a later
statement, and whole earlier chunks before later ones. A kernel in which one thread reads or
writes a global element another thread writes, with nothing ordering the two, then still gives
eager's answer on the CPU while a GPU, which runs the threads in any order, may not (an in-place
output read back by a neighbour, two threads storing one element). This check fails such a
kernel with a `KernelRaceError` naming the kernel, the buffer, the element and the two threads.

Model (happens-before over one launch, whatever the chunks: a race between blocks of different
chunks is found as well). Only storages the kernel writes (a `Store` or `AtomicAdd` pointer, with
every parameter sharing that storage: an in-place output and its input) are tracked. Threads are
(block, thread) of the whole grid; each block counts its `Sync`s (its epoch, `ep`). Per tracked
element: the last writer (thread, block, code) and a summary of the readers since (none; one
thread; several threads of one block, with the latest code; threads of several unordered blocks),
and the atomic accesses (`AtomicAdd`, the reads of `WaitCount`). Codes: a plain access in epoch e
is 2e + 1, an atomic one 2e. An earlier access by thread p is ordered before the current access by
thread c when p == c; or both are in one block and a `Sync` of it came between (`__syncthreads`
orders the block's global accesses too); or, across blocks (kernels with atomics or clusters),
when c's block has acquired p's access (vector clocks `vc[block, block]`):
- an `AtomicAdd` of block b releases what b's threads did before its last `Fence` when a `Sync`
  followed it (codes < 2e + 1: the fenced epochs and the atomic itself; the ticket pattern
  `Fence; Sync; atomic`, or a thread's `Fence; atomic`), else what came before its last fence's
  epoch; it releases b's vector clock with it (transitively);
- an `AtomicAdd` acquires what every earlier atomic on its word released (atomics apply in row
  order, a valid order of a GPU's), a `WaitCount` everything released on its word (the
  interpreter reaches it only once every block has arrived); acquisition is per block (the
  kernels pass what the atomic thread learnt to the others through shared memory and a `Sync`,
  which interpreter_shared.py checks);
- a `ClusterSync` orders everything before it in the cluster's blocks before everything after;
  split, everything before the "arrive" before everything after the "wait" (what a block does
  between the two is a new epoch, which the wait acquires for no other block).
An atomic is ordered after the earlier atomics on its word (one modification order): a plain
access ordered after the last `AtomicAdd` on a word is ordered after every earlier one.
Flagged: two threads writing one element (also in one statement); a plain write or read
unordered with another thread's write; a plain write unordered with another thread's read
(readers of several unordered blocks are not told apart: a write after them by a thread not
ordered after all of them is flagged); a plain access unordered with another thread's atomic one.
Not modelled: the finer per-thread placement of a `Fence` within an epoch (a block's fence covers
its epoch); a launch whose vector clocks would be too large (more than VC_LIMIT blocks in a
kernel with atomics or clusters) is not checked.
"""
from __future__ import annotations

import os

import torch

from . import kernel_ir as K
from .interpreter_shared import KernelRaceError

RACECHECK_ENV = "PYFUSER_INTERP_RACECHECK"
VC_LIMIT = 4096          # blocks: vector clocks are VC_LIMIT^2 int64 at most (128 MiB)
_OFF = ("", "0", "false", "no", "off")
stats = {"launches": 0, "unchecked": 0}    # launches tracked; of them, left unchecked (VC_LIMIT)


def enabled() -> bool:
    return os.environ.get(RACECHECK_ENV, "").strip().lower() not in _OFF


class _Storage:
    """Race bookkeeping of one tracked storage (elements of its own dtype)."""
    __slots__ = ("wg", "wc", "rs", "rg", "rg2", "rb", "rc", "atoms", "amask")

    def __init__(self, n):
        full = lambda: torch.full((n,), -1, dtype=torch.int64)  # noqa: E731
        self.wg, self.wc = full(), full()              # writer thread (-1 none), its code
        self.rs = torch.zeros(n, dtype=torch.int8)     # readers: 0 none, 1 one thread, 2 several
        self.rg, self.rb, self.rc = full(), full(), full()  # of a block, 3 several blocks; the
        self.rg2 = full()     # lowest and highest reader, the readers' block, their latest code
        self.atoms: dict = {}     # element -> [last AtomicAdd (g, b, code) or None, {b: (g, code)}]
        self.amask = torch.zeros(n, dtype=torch.bool)  # elements with atomic records


class GlobalRaces:
    """The race tracker of one launch (module docstring); the interpreter calls `read`, `write`,
    `atomic`, `wait`, `sync`, `cluster_sync` and `fence` with the active threads' rows."""

    def __init__(self, kernel: K.Kernel, tensors: dict, grid, block):
        self.k, self.grid, self.bdim = kernel, grid, block
        self.T = block[0] * block[1] * block[2]
        nb = grid[0] * grid[1] * grid[2]
        stmts = list(kernel.walk())
        written = {s.ptr for s in stmts if isinstance(s, (K.Store, K.AtomicAdd))}
        keys = {n: (t.untyped_storage().data_ptr(), t.element_size())
                for n, t in tensors.items() if t.numel()}
        storages: dict = {}
        self.ptrs: dict = {}                       # ptr name -> (_Storage, first element)
        for n, key in keys.items():
            if key not in {keys[w] for w in written if w in keys}:
                continue
            t = tensors[n]
            if key not in storages:
                storages[key] = _Storage(t.untyped_storage().nbytes() // t.element_size())
            self.ptrs[n] = (storages[key], t.storage_offset())
        self.ep = torch.zeros(nb, dtype=torch.int64)
        self.fenced = torch.zeros(nb, dtype=torch.int64)
        self.rel: dict = {}                        # (storage id, element) -> released clocks
        self.arrived: dict = {}                    # cluster -> what its split barrier's arrive released
        cross = kernel.cluster > 1 or any(isinstance(s, (K.AtomicAdd, K.WaitCount)) for s in stmts)
        self.vc = torch.full((nb, nb), -1, dtype=torch.int64) if cross and nb <= VC_LIMIT else None
        self.off = cross and self.vc is None or not self.ptrs
        stats["launches"] += 1
        stats["unchecked"] += bool(self.ptrs) and cross and self.vc is None
        self.b0 = 0

    # ---- naming -------------------------------------------------------------------------------
    def _who(self, g) -> str:
        g = int(g)
        gx, gy, _ = self.grid
        bx, by, _ = self.bdim
        b, t = divmod(g, self.T)
        return (f"block ({b % gx},{b // gx % gy},{b // (gx * gy)}) "
                f"thread ({t % bx},{t // bx % by},{t // (bx * by)})")

    def _fail(self, ptr, elem, first, second) -> None:
        base = self.ptrs[ptr][1]
        raise KernelRaceError(f"{self.k.name}: global race on {ptr}[{int(elem) - base}]: {first} and "
                              f"{second}, with nothing ordering them")

    # ---- ordering -----------------------------------------------------------------------------
    def _ordered(self, pg, pb, pc, g, b):
        """Earlier accesses (thread pg, block pb, code pc) happen before the current ones (thread
        g, block b): tensors of one shape (pg -3 where no one thread is meant)."""
        ok = (pg == g) | ((pb == b) & (self.ep[b] > torch.div(pc, 2, rounding_mode="floor")))
        if self.vc is not None:
            ok = ok | ((pb >= 0) & (self.vc[b, pb.clamp(min=0)] > pc))
        return ok

    def _elems(self, ptr, offs, rows):
        """(storage, elements, threads, blocks), flat, the threads broadcast over the lanes."""
        st, base = self.ptrs[ptr]
        g = rows + self.b0 * self.T
        if not isinstance(offs, torch.Tensor):
            offs = torch.full_like(g, int(offs))
        if offs.dim() == 2:
            g = g.view(-1, 1).expand_as(offs)
        e = (offs + base).reshape(-1)
        g = g.reshape(-1)
        return st, e, g, torch.div(g, self.T, rounding_mode="floor")

    def _check_writer(self, st, e, g, b, ptr, what, wg=None):
        wg = st.wg[e] if wg is None else wg
        has = wg >= 0
        if not bool(has.any()):
            return
        bad = has & ~self._ordered(wg, torch.div(wg, self.T, rounding_mode="floor"), st.wc[e], g, b)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            self._fail(ptr, e[i], f"written by {self._who(wg[i])}", f"{what} by {self._who(g[i])}")

    def _check_readers(self, st, e, g, b, ptr, what):
        rs = st.rs[e]
        if not bool(rs.any()):
            return False
        pg = torch.where(rs == 1, st.rg[e], torch.full_like(g, -3))
        bad = (rs == 3) | ((rs != 0) & ~self._ordered(pg, st.rb[e], st.rc[e], g, b))
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            x, r = e[i], int(rs[i])
            other = st.rg[x] if st.rg[x] != g[i] else st.rg2[x]
            who = {1: "read by ", 2: "read by several threads of one block, as ",
                   3: "read by threads of several unordered blocks, as "}[r]
            self._fail(ptr, x, who + self._who(other), f"{what} by {self._who(g[i])}")
        return True

    def _check_atoms(self, st, e, g, b, ptr, what, write):
        if not st.atoms:
            return
        hit = st.amask[e]
        if not bool(hit.any()):
            return
        for i in hit.nonzero().view(-1).tolist():
            rmw, reads = st.atoms[int(e[i])]
            recs = ([rmw] if rmw is not None else []) + \
                ([(rg, rb, rc) for rb, (rg, rc) in reads.items()] if write else [])
            for pg, pb, pc in recs:
                ok = self._ordered(torch.tensor([pg]), torch.tensor([pb]), torch.tensor([pc]),
                                   g[i:i + 1], b[i:i + 1])
                if not bool(ok.all()):
                    self._fail(ptr, e[i], f"accessed atomically by {self._who(pg)}",
                               f"{what} by {self._who(g[i])}")

    # ---- accesses -----------------------------------------------------------------------------
    def write(self, ptr, offs, rows) -> None:
        if self.off or ptr not in self.ptrs:
            return
        st, e, g, b = self._elems(ptr, offs, rows)
        old = st.wg[e]
        st.wg[e] = g                 # one of the threads storing an element: the others differ
        dup = st.wg[e] != g
        if bool(dup.any()):
            i = int(dup.nonzero()[0])
            one, two = sorted((int(st.wg[e[i]]), int(g[i])))
            self._fail(ptr, e[i], f"written by {self._who(one)}",
                       f"by {self._who(two)} in the same statement")
        self._check_writer(st, e, g, b, ptr, "written", old)
        read = self._check_readers(st, e, g, b, ptr, "written")
        self._check_atoms(st, e, g, b, ptr, "written", True)
        st.wc[e] = 2 * self.ep[b] + 1
        if read:
            st.rs[e] = 0
        if st.atoms and bool(st.amask[e].any()):
            for x in e[st.amask[e]].unique().tolist():
                del st.atoms[x]
                self.rel.pop((id(st), x), None)
            st.amask[e] = False

    def read(self, ptr, offs, rows) -> None:
        if self.off or ptr not in self.ptrs:
            return
        st, e, g, b = self._elems(ptr, offs, rows)
        self._check_writer(st, e, g, b, ptr, "read")
        self._check_atoms(st, e, g, b, ptr, "read", False)
        u, inv = torch.unique(e, return_inverse=True)
        m = u.shape[0]
        red = lambda src, how, fill: torch.full((m,), fill, dtype=torch.int64).scatter_reduce(  # noqa: E731
            0, inv, src, how, include_self=False)
        gmin, gmax = red(g, "amin", 0), red(g, "amax", 0)
        bmin, bmax = red(b, "amin", 0), red(b, "amax", 0)
        code = red(2 * self.ep[b] + 1, "amax", 0)
        srs = torch.where(bmin != bmax, 3, torch.where(gmin != gmax, 2, 1)).to(torch.int8)
        ors, org, orb, orc = st.rs[u], st.rg[u], st.rb[u], st.rc[u]
        same = (ors != 0) & (ors != 3) & (srs != 3) & (orb == bmin)
        opg = torch.where(ors == 1, org, torch.full_like(org, -3))
        before = (ors != 0) & (ors != 3) & (srs != 3) & ~same & self._ordered(opg, orb, orc, gmin, bmin)
        take = (ors == 0) | before
        merged_rs = torch.where((ors == 1) & (srs == 1) & (org == gmin), 1, 2).to(torch.int8)
        rs = torch.where(take, srs, torch.where(same, merged_rs, torch.full_like(srs, 3)))
        st.rs[u] = rs
        st.rg[u] = torch.where(take, gmin, torch.where(same, torch.minimum(org, gmin), org))
        org2 = st.rg2[u]
        st.rg2[u] = torch.where(take, gmax, torch.where(same, torch.maximum(org2, gmax), org2))
        st.rb[u] = torch.where(take, bmin, orb)
        st.rc[u] = torch.where(take, code, torch.where(same, torch.maximum(orc, code), orc))

    def _atom_record(self, st, x):
        if x not in st.atoms:
            st.atoms[x] = [None, {}]
            st.amask[x] = True
        return st.atoms[x]

    def atomic(self, ptr, offs, rows) -> None:
        """An AtomicAdd of the active threads (in row order) on ptr[offs]."""
        if self.off or ptr not in self.ptrs:
            return
        st, e, g, b = self._elems(ptr, offs, rows)
        self._check_writer(st, e, g, b, ptr, "updated atomically")
        self._check_readers(st, e, g, b, ptr, "updated atomically")
        E, F = self.ep[b], self.fenced[b]
        rcode = torch.where(F >= E, 2 * E + 1, 2 * F)     # what each thread's atomic releases
        for x in e.unique().tolist():
            idx = (e == x).nonzero().view(-1)
            bs = b[idx]
            if self.vc is not None:
                M = self.vc[bs].clone()
                ar = torch.arange(bs.shape[0])
                M[ar, bs] = torch.maximum(M[ar, bs], rcode[idx])
                rel = self.rel.get((id(st), x))
                rel = torch.full((self.vc.shape[0],), -1, dtype=torch.int64) if rel is None else rel
                pref = torch.cummax(M, 0).values
                acq = torch.cat([rel.view(1, -1), torch.maximum(pref[:-1], rel.view(1, -1))])
                for j in range(bs.shape[0]):                 # rows of one block: in order
                    self.vc[bs[j]] = torch.maximum(self.vc[bs[j]], acq[j])
                self.rel[(id(st), x)] = torch.maximum(rel, pref[-1])
            i = int(idx[-1])
            self._atom_record(st, x)[0] = (int(g[i]), int(b[i]), 2 * int(E[i]))

    def wait(self, ptr, offs, rows) -> None:
        """A WaitCount of the active threads on ptr[offs]: an atomic read, acquiring."""
        if self.off or ptr not in self.ptrs:
            return
        st, e, g, b = self._elems(ptr, offs, rows)
        self._check_writer(st, e, g, b, ptr, "waited on")
        for i in range(e.shape[0]):
            x, bi = int(e[i]), int(b[i])
            rel = self.rel.get((id(st), x))
            if self.vc is not None and rel is not None:
                self.vc[bi] = torch.maximum(self.vc[bi], rel)
            reads = self._atom_record(st, x)[1]
            old = reads.get(bi)
            code = 2 * int(self.ep[bi])
            reads[bi] = (int(g[i]) if old is None or old[0] == int(g[i]) else -3, code)

    # ---- barriers -----------------------------------------------------------------------------
    def _blocks(self, rows):
        return torch.unique(torch.div(rows, self.T, rounding_mode="floor")) + self.b0

    def sync(self, rows) -> None:
        """A Sync reached by the blocks of `rows` (the interpreter checked whole blocks)."""
        if not self.off:
            self.ep[self._blocks(rows)] += 1

    def fence(self, rows) -> None:
        if not self.off:
            blk = self._blocks(rows)
            self.fenced[blk] = self.ep[blk] + 1

    def cluster_sync(self, rows, phase: str = "sync") -> None:
        """A cluster barrier, or its "arrive" / "wait" half (the interpreter checked whole
        clusters and the halves' order): the release is taken at the arrive (or the barrier),
        each member acquires it at the wait (or the barrier)."""
        if self.off:
            return
        blk = self._blocks(rows)
        if phase != "wait":
            self.ep[blk] += 1
        if self.vc is None:
            return
        C = self.k.cluster
        for c in torch.unique(torch.div(blk, C, rounding_mode="floor")).tolist():
            members = torch.arange(c * C, (c + 1) * C)
            if phase == "wait":
                row = self.arrived.pop(c)
            else:
                row = self.vc[members].amax(0)
                row[members] = torch.maximum(row[members], 2 * self.ep[members])
            if phase == "arrive":
                self.arrived[c] = row
            else:
                self.vc[members] = torch.maximum(self.vc[members], row)
