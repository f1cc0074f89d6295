"""How a graphed inference call (cuda_graphs.py's GraphedInference) hands out a replay's outputs:
the option `cuda_graph_outputs` (`torch.compile(m, backend="pyfuser", mode="reduce-overhead",
options={"cuda_graph_outputs": ...})`, `pyfuser.compile(m, cuda_graphs=True, ...)`).

- `"graph"` (the default): the outputs are tensors on the graph's own output memory, as
  Inductor's CUDA graphs hand them out: no copy. They are valid until the next replay of the
  same input signature writes that memory again, or until the signature's graph is dropped
  (another signature pushed it out of the MAX_GRAPHS kept, the compiled graph was freed). A
  tensor still held then is invalidated, never silently changed: reading it raises an error
  that says so and names the fix (clone an output kept across calls, or `"copy"`).
- `"copy"`: every replay's outputs are copies in the caller's memory (runtime/graph_capture.py's
  `fresh_copies`), valid for good; each call copies each output once (a model returning large
  logits pays that copy on every call).

`SharedOutputs` does `"graph"` for one captured signature. Each storage the captured run's
outputs lie on (an "owner": the entry keeps it, and so the graph's memory, for its life) is
shown to callers through a storage of its own on the same memory (`alias`: not owning it), which
every handed-out tensor on it references: its use count says whether a caller still holds one
(and its Python object's reference count, whether a caller holds the storage itself:
`out.untyped_storage()` is that object). Before the next replay (`retire`), an alias still in
use is invalidated (the build's `torch._C._set_storage_data_ptr_access_error_msg`, through the
capture backend's `invalidate`) and a new alias takes its place; one no longer in use is handed
out again as it is (the usual case: a loop that drops each result before the next call makes one
tensor per output and no copy). When the entry is dropped (`drop`), every alias still in use is
invalidated, once the call that drops it has read its inputs (an output fed to the call whose
new signature pushes its graph out, or to a capture again, is read first). One thread calls a
graphed call at a time (its replays and hand-outs are not locked).

Invariants: an alias is used only while its owner is alive; a tensor handed out is either
valid (the last replay's values, which no later replay wrote) or invalidated; outputs that
shared a storage in the captured run share one alias, with the captured sizes, strides and
offsets. A build without `_set_storage_data_ptr_access_error_msg` (no CUDA) gets `"copy"`.
"""
from __future__ import annotations

import sys

import torch

MODES = ("graph", "copy")


def alias(storage):
    """A storage on `storage`'s memory that does not own it (its own use count)."""
    return torch._C._construct_storage_from_data_pointer(storage.data_ptr(), storage.device,
                                                         storage.nbytes())


def use_count(storage) -> int:
    """How many strong references the storage's memory has (tensors, views, storages)."""
    return torch._C._storage_Use_Count(storage._cdata)


def holders(storages, native=None) -> tuple:
    """Per storage, (its use count, its Python object's reference count): what changes when a
    caller takes a tensor on it, or the storage itself (`out.untyped_storage()` is that object:
    a storage has one Python object, and holding it moves no use count). The use counts in one
    C++ call where the native runner (`native`) is built."""
    counts = native.use_counts(storages) if native is not None else \
        [use_count(st) for st in storages]
    return tuple(zip(counts, map(sys.getrefcount, storages)))


def stale_message(name: str) -> str:
    return (f"pyfuser: this tensor is an output of a CUDA-graph replay of {name}, and a later "
            "call with the same input shapes replayed the graph into its memory (or the graph "
            "was dropped): clone an output you keep across calls (out.clone()), or compile with "
            "options={'cuda_graph_outputs': 'copy'}")


class SharedOutputs:
    """The `"graph"` hand-out of one captured signature (module docstring). `out`: the captured
    run's result (a list or tuple of tensors and plain values); `backend`: the capture backend
    (its `invalidate(storage, message)`); `native`: the native runner's module or None."""
    __slots__ = ("out", "owners", "aliases", "counts", "layout", "items", "backend", "message",
                 "native", "made")

    def __init__(self, out, backend, message: str, native=None):
        self.out, self.backend, self.message, self.native = out, backend, message, native
        index: dict = {}
        self.owners, self.layout = [], []
        for o in out:
            if not isinstance(o, torch.Tensor):
                self.layout.append(None)                      # handed out as it is
                continue
            st = o.untyped_storage()
            if not st.nbytes():
                self.layout.append(False)                     # a new empty tensor
                continue
            k = index.get(st.data_ptr())
            if k is None:
                k = index[st.data_ptr()] = len(self.owners)
                self.owners.append(st)
            self.layout.append((k, o.dtype, tuple(o.shape), o.stride(), o.storage_offset()))
        self.aliases = [alias(st) for st in self.owners]
        self.made = 0                    # tensors handed out (tests read it)
        self._remake()

    def _remake(self) -> None:
        """The hand-out's items on the current aliases, and their use counts with no tensor of
        a caller on them."""
        self.items = [(self.aliases[h[0]], *h[1:]) for h in self.layout if h]
        self.counts = self._use_counts()

    def _use_counts(self) -> tuple:
        """Each alias's holders (`holders`)."""
        return holders(self.aliases, self.native)

    def hand_out(self):
        """This replay's results: tensors on the aliases (one C++ call where the runner is
        built), in the captured result's structure."""
        if self.native is not None:
            made = iter(self.native.hand_out(self.items))
        else:
            made = iter([torch.empty(0, dtype=dtype, device=st.device).set_(st, off, size, stride)
                         for st, dtype, size, stride, off in self.items])
        res = []
        for o, h in zip(self.out, self.layout):
            if h is None:
                res.append(o)
            elif h is False:
                res.append(torch.empty_strided(o.shape, o.stride(), dtype=o.dtype,
                                               device=o.device))
            else:
                res.append(next(made))
        self.made += len(self.items)
        return tuple(res) if isinstance(self.out, tuple) else res

    def in_use(self) -> list:
        """The indices of the aliases a caller still holds a tensor on."""
        return [k for k, (n, base) in enumerate(zip(self._use_counts(), self.counts)) if n != base]

    def retire(self) -> int:
        """Before a replay: invalidate each alias still in use and put a new one in its place;
        how many were."""
        used = self.in_use()
        for k in used:
            self._invalidate(self.aliases[k])
            self.aliases[k] = alias(self.owners[k])
        if used:
            self._remake()
        return len(used)

    def drop(self) -> int:
        """The graph goes: invalidate every alias still in use; how many were."""
        used = self.in_use()
        for k in used:
            self._invalidate(self.aliases[k])
        self.aliases = []
        self.items, self.counts = [], ()
        return len(used)

    def _invalidate(self, st) -> None:
        self.backend.invalidate(st, self.message)


def drop_all(entries) -> None:
    """Every entry's hand-out dropped (a GraphedInference's finalizer: the graphs go with it)."""
    for e in list(entries.values()):
        if e.hand is not None:
            e.hand.drop()
            e.hand = None


__all__ = ["MODES", "SharedOutputs", "alias", "drop_all", "holders", "stale_message",
           "use_count"]
