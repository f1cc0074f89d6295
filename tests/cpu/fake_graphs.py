"""A stand-in for runtime/graph_capture.Backend (torch.cuda.CUDAGraph) in CPU tests of graphed
calls (pyfuser.jit(f, cuda_graphs=True), torch.compile's mode="reduce-overhead"): `capture`
runs the function twice (the warm-up, then the run whose outputs the graph owns) and returns
(graph, outputs); `replay` runs it again and writes the results into those same output
storages, which is what replaying a graph does. `any_device`: CPU tensors stand for CUDA ones.
It cannot show stream or address effects of a real graph. Random numbers as a graph draws
them: the recorded run and each replay run inside runtime/rng.py's `capturing`, a fresh one each
time (a replay re-runs the captured `torch.randint`, so new device words, while the kernels'
host seed and offsets are the capture's again). tests/conftest.py's fixture `fake_graphs` makes
torch.compile's graphed calls use one. With `invalidates`, it says it can invalidate storages
(as a CUDA build's Backend does) and records the storages it was asked to (`is_invalid`),
keeping them alive so that their addresses, by which `is_invalid` knows them, are not reused;
it cannot make reading them raise. With `poison` as well, an invalidated storage's memory is
filled with NaNs (float32's bytes 0xff), so that a read after the invalidation (which a CUDA
build's raises) shows in the values."""
import torch

from pyfuser.runtime import rng


class FakeGraphs:
    any_device = True

    def __init__(self, fail=None, invalidates=False, poison=False):
        self.captures = self.replays = 0
        self.fail = fail
        self.can_invalidate = invalidates
        self.invalid: set = set()            # the storages invalidated (their StorageImpl)
        self.poison = poison
        self.kept: list = []                 # the storages invalidated, kept alive

    def invalidate(self, storage, message):
        assert self.can_invalidate and "clone" in message
        self.invalid.add(storage._cdata)
        self.kept.append(storage)      # alive: no later storage takes its address (_cdata)
        if self.poison:
            torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).fill_(255)

    def is_invalid(self, t) -> bool:
        return t.untyped_storage()._cdata in self.invalid

    def capture(self, fn, device):
        if self.fail:
            raise RuntimeError(self.fail)
        fn()                                # the warm-up
        device = device if device is not None else "cpu"
        with rng.capturing(device):
            out = fn()
        self.captures += 1
        if hasattr(fn, "args"):             # a BoundCall: replays read its inputs by address
            return (_by_address(fn), out, device), out
        return (fn, out, device), out

    def replay(self, graph):
        fn, out, device = graph
        with rng.capturing(device):
            new = fn()
        for o, n in zip(flat(out), flat(new)):      # the same layout: whole storages
            o.untyped_storage().copy_(n.untyped_storage())
        self.replays += 1


def flat(x) -> list:
    """The tensors of a result (nested lists / tuples), in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in flat(e)]
    return []


class _At:
    """Where a tensor argument lies (its storage's address and size, its layout)."""

    def __init__(self, t):
        st = t.untyped_storage()
        self.ptr, self.nbytes = st.data_ptr(), st.nbytes()
        self.device, self.dtype = t.device, t.dtype
        self.layout = (t.storage_offset(), tuple(t.shape), t.stride())

    def tensor(self):
        st = torch._C._construct_storage_from_data_pointer(self.ptr, self.device, self.nbytes)
        return torch.empty(0, dtype=self.dtype, device=self.device).set_(st, *self.layout)


def _by_address(call):
    """A function running `call` on tensors rebuilt at its arguments' addresses (without
    holding them, as a graph holds none of its inputs): what a replay reads is whatever is at
    those addresses then."""
    compiled = call.compiled
    where = [_At(a) if isinstance(a, torch.Tensor) else a for a in call.args]
    return lambda: compiled([w.tensor() if isinstance(w, _At) else w for w in where])

