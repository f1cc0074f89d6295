"""`pyfuser.explain` (package `pyfuser.explainer`): what the compiler did with a program, and why.

    e = pyfuser.explain(fn, *example_inputs, bench=False)
    print(e)                        # plain text (e.text(verbose=True): the ops of every segment)
    e.as_dict()                     # the same as data (`pyfuser explain --json`)
    e.to_html("report.html")        # one self-contained page: the graph, groups, segments, CUDA

`fn` is anything a frontend takes (frontends.py): TorchScript (scripted or traced functions and
modules, a torch Graph, IR text, a .ir path, a `pyfuser.jit` result; a plain function or
nn.Module is scripted, or traced with the example inputs when it does not script) or
nvFuser-style (FusionDefinition, pyfuser Fusion). The program runs once on the example inputs
(for IR text without inputs: seeded random inputs made from its declared types). The report
gives, per fusion group, its segments, the scheduler each kernel got and why each scheduler
ranked above it refused, each cut the segmenter made with its reason, the heuristic parameters,
the launch configuration, the bytes each kernel moves and, with `bench=True` on a GPU, its time
against a copy of the same bytes; and every op left outside the groups with the reason and the
op that blocked it (model.py describes every field).

The segments are worked out under torch.no_grad(); a group that autograd would run eagerly
(grad mode on and an input requiring grad) is marked so, with its segments as they would be
under no_grad.
"""
from __future__ import annotations

from .model import Explanation


def explain(fn, *example_inputs, bench: bool = False, device: str | None = None,
            seed: int = 0) -> Explanation:
    """The Explanation of `fn` run on `example_inputs` (module docstring). `device` maps the
    devices IR text declares (as `pyfuser run --device`) and places inputs made from them;
    `seed` seeds those inputs."""
    import torch
    from ..codegen.prelude import PRELUDE
    from .frontends import collect
    from .fusion_report import explain_group
    c = collect(fn, list(example_inputs), {"device": device, "seed": seed})
    with torch.no_grad():
        groups = [explain_group(g, bench=bench) for g in c.groups]
    notes = list(c.notes)
    if bench and c.device != "cuda":
        notes.append("--bench times kernels on a GPU only: no timings on the CPU")
    return Explanation(c.source, c.frontend, c.device, c.executor, groups, c.fallbacks,
                       c.picture, notes, PRELUDE)


__all__ = ["explain", "Explanation"]
