"""A stand-in for runtime/graph_capture.Backend (torch.cuda.CUDAGraph) in CPU tests of graphed
calls (pyfuser.jit(f, cuda_graphs=True), torch.compile's mode="reduce-overhead"): `capture`
runs the function twice (the warm-up, then the run whose outputs the graph owns) and returns
(graph, outputs); `replay` runs it again and writes the results into those same output
storages, which is what replaying a graph does. `any_device`: CPU tensors stand for CUDA ones.
It cannot show stream or address effects of a real graph."""
import torch


class FakeGraphs:
    any_device = True

    def __init__(self, fail=None):
        self.captures = self.replays = 0
        self.fail = fail

    def capture(self, fn, device):
        if self.fail:
            raise RuntimeError(self.fail)
        fn()                                # the warm-up
        out = fn()
        self.captures += 1
        return (fn, out), out

    def replay(self, graph):
        fn, out = graph
        for o, n in zip(flat(out), flat(fn())):      # the same layout: whole storages
            o.untyped_storage().copy_(n.untyped_storage())
        self.replays += 1


def flat(x) -> list:
    """The tensors of a result (nested lists / tuples), in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in flat(e)]
    return []
