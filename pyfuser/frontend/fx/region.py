"""A fused region at run time: the callable the rewritten FX graph calls in the region's place.

`FusedRegion(name, lowered, region, root)` is called with the region's inputs (its FX inputs'
values, in `Region.inputs` order: tensors and SymInt values) and returns the tuple of its
outputs. It runs the region's Fusion through its cached-call programs (`dispatch.programs(fusion)
.run`: what `runtime.dispatch.execute_fusion`, the single entry point, does with no mode, one
frame fewer), with the fusion's inputs picked from the call's (tensors first, then the SymInts
the fusion takes as scalars, and the 0-dim CPU tensors a region on CUDA takes by value, as
their numbers: `.item()` of a CPU tensor, no device sync).

Results are eager's: values and dtypes by construction of the lowering; layouts are checked
against eager's (the example values FX recorded): an output that should be dense in some stride
order and is not (a copy that eager makes contiguous, say) is copied into that layout, so the
views downstream in the graph see eager's strides. Inputs a fusion cannot take (an ExecuteError:
a size 1 where the fusion has a full axis, say) run the region's own nodes eagerly for that call,
logged once per region and reason; so does a region whose lowering failed when it was compiled.
"""
from __future__ import annotations

import logging

import torch

from ...errors import ExecuteError
from ...runtime import dispatch
from .meta import dense_strides, hint, meta, shape_hints, stride_hints

log = logging.getLogger("pyfuser")
_SEEN_LAYOUTS = 16     # (sizes, strides) remembered as dense per output (dynamic shapes vary)


def eager_module(region, root):
    """A GraphModule running the region's own nodes (the eager fallback)."""
    g = torch.fx.Graph()
    env = {}
    for x in region.inputs:
        env[x] = g.placeholder(x.name)
    for n in region.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[o] for o in region.outputs))
    return torch.fx.GraphModule(root, g)


class FusedRegion:
    def __init__(self, name: str, lowered, region, root):
        self.__name__ = name
        self.__qualname__ = name
        self.lowered = lowered
        self.fusion = lowered.fusion
        tensors = [k for k, x in enumerate(region.inputs) if k not in lowered.scalar_inputs
                   and isinstance(x.meta.get("val"), torch.Tensor)]
        self.picks = tensors + list(lowered.scalar_inputs)
        # 0-dim CPU tensors the fusion takes by value (a region on CUDA): passed as numbers
        self.by_value = [i for i, k in enumerate(self.picks) if k in lowered.scalar_inputs and
                         isinstance(region.inputs[k].meta.get("val"), torch.Tensor)]
        self.identity = self.picks == list(range(len(region.inputs))) and not self.by_value
        self.outputs = list(lowered.outputs)
        # per output eager makes dense: (output, axes outermost first, row-major?, the (sizes,
        # strides) already found dense in that order): a permuted-dense check is Python
        # arithmetic (~1.7 µs), a lookup of the output's sizes and strides ~0.3 µs; a region
        # casting and transposing all of BERT's weights checks 26 such outputs a call
        self.checks = [(k, order, order == list(range(len(order))), set())
                       for k, (order, dense) in enumerate(lowered.out_layouts) if dense]
        self.empty = _empty_outputs(region)
        self.progs = dispatch.programs(self.fusion)
        self.all_outputs = self.outputs == list(range(len(self.fusion.outputs)))
        self.plain = not self.empty and not self.checks                    # nothing to check
        self.node_names = [n.name for n in region.nodes]
        vals = [x.meta.get("val") for x in list(region.inputs) + list(region.outputs)]
        self.on_cuda = any(isinstance(v, torch.Tensor) and v.is_cuda for v in vals)
        self.ops = [str(n.target) for n in region.nodes]
        self._eager = None
        self._region, self._root = region, root
        self.region = region
        self.calls = 0
        self.eager_calls = 0
        self._logged: set = set()

    def eager(self, *args):
        if self._eager is None:
            self._eager = eager_module(self._region, self._root)
        return self._eager(*args)

    def fusion_inputs(self, args) -> list:
        """The fusion's inputs from the region's (tensors first, then the scalars; 0-dim CPU
        tensors taken by value as their numbers)."""
        inputs = [args[k] for k in self.picks]
        for i in self.by_value:
            inputs[i] = inputs[i].item()
        return inputs

    def __call__(self, *args):
        inputs = args if self.identity else self.fusion_inputs(args)
        try:      # the fusion's cached-call programs (dispatch.programs): execute_fusion's path
            outs = self.progs.run(inputs)
        except ExecuteError as e:
            self._note(str(e))
            self.eager_calls += 1
            return self.eager(*args)
        self.calls += 1
        result = tuple(outs) if self.all_outputs else tuple(outs[i] for i in self.outputs)
        if self.plain:
            return result
        for k, order, row_major, seen in self.checks:
            t = result[k]
            if row_major:
                if t.is_contiguous():
                    continue
            else:
                sig = (t.shape, t.stride())
                if sig in seen:
                    continue
                if _dense_in(t, order):
                    if len(seen) < _SEEN_LAYOUTS:
                        seen.add(sig)
                    continue
            result = result[:k] + (_relayout(t, order),) + result[k + 1:]
        for k, shape, strides in self.empty:
            t = result[k]
            if tuple(t.shape) == shape and t.stride() != strides:
                result = result[:k] + (t.new_empty_strided(shape, strides),) + result[k + 1:]
        return result

    def prepare(self) -> int:
        """Plan the Fusion's kernels for inputs like the FX example values (meta stand-ins:
        their dtypes, sizes, strides and storage offsets; SymInts as their hints) and start
        compiling them in the background (runtime/prepare.py). Returns the kernels prepared."""
        from ...runtime.prepare import prepare_fusion
        from .plan_cache import arch_of, region_target
        try:
            mode, device = region_target(self._region)
            vals = [meta(x) for x in self._region.inputs]
            inputs = [_hinted(vals[k]) if isinstance(vals[k], torch.Tensor)
                      else _scalar_hint(vals[k]) for k in self.picks]
            for i in self.by_value:                 # a stand-in: kernels take any value
                inputs[i] = torch.ones((), dtype=inputs[i].dtype).item()
            arch = arch_of(mode, device)
        except Exception as e:  # noqa: BLE001 - best effort: the first call plans then
            log.debug("pyfuser: region %s not prepared: %s", self.__name__, e)
            return 0
        return prepare_fusion(self.fusion, inputs, mode, arch)

    def _note(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            log.info("pyfuser: region %s runs eagerly for these inputs: %s", self.__name__, reason)

    def kernels(self) -> int:
        """Kernels the last call ran (launched on CUDA; kernel segments run on the CPU)."""
        r = dispatch.last_report(self.fusion)
        if r is None:
            return 0
        return r.launched if self.on_cuda else r.kernels

    def __repr__(self) -> str:
        return f"FusedRegion({self.__name__}: {len(self.ops)} nodes)"


def _hinted(v: torch.Tensor) -> torch.Tensor:
    """A meta tensor with v's dtype, sizes, strides and storage offset (SymInts' hints)."""
    from ...runtime.prepare import meta_tensor
    return meta_tensor(v.dtype, shape_hints(v), stride_hints(v), hint(v.storage_offset()))


def _empty_outputs(region) -> list:
    """[(k, shape, strides)] of the outputs whose example value has no element and static
    sizes: eager lays an empty result out with strides no density rule gives (a cast of an
    empty permuted slice keeps the slice's strides), so such an output takes them as they are."""
    out = []
    for k, node in enumerate(region.outputs):
        v = meta(node)
        if isinstance(v, torch.Tensor) and all(type(s) is int for s in (*v.shape, *v.stride())) \
                and v.numel() == 0:
            out.append((k, tuple(v.shape), tuple(v.stride())))
    return out


def _scalar_hint(v):
    """A SymInt / SymFloat / SymBool as the value it was traced with."""
    node = getattr(v, "node", None)
    h = getattr(node, "hint", None)
    if h is not None:
        return h
    return v


def _dense_in(t: torch.Tensor, order) -> bool:
    want = dense_strides(t.shape, order)
    return all(s == w or n == 1 for s, w, n in zip(t.stride(), want, t.shape))


def _relayout(t: torch.Tensor, order) -> torch.Tensor:
    out = torch.empty_strided(t.shape, dense_strides(t.shape, order), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out
