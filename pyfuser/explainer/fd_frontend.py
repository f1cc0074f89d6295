"""`explain` of nvFuser-style programs: a FusionDefinition, a pyfuser Fusion or an IR Fusion.

The whole Fusion is one group; its ops are the Fusion's exprs. A subclass-form definition not
defined yet is defined (and run) by `execute` on the example inputs first. There is no graph
outside the group, so no fallbacks and no picture beyond the group itself.
"""
from __future__ import annotations

import torch

from ..errors import PyfuserError
from .frontends import Collected, GroupSource


def _ir_fusion(obj, inputs):
    from ..frontend.definition import Fusion, FusionDefinition
    from ..ir.fusion import Fusion as IRFusion
    if isinstance(obj, IRFusion):
        return obj, "Fusion IR"
    if isinstance(obj, FusionDefinition):
        fs = obj.fusion
        if not fs.is_defined():
            obj.execute(list(inputs))
        return fs.ir_fusion, f"FusionDefinition (fusion id {fs.id()})"
    if isinstance(obj, Fusion):
        return obj.ir_fusion, f"Fusion (fusion id {obj.id()})"
    raise PyfuserError(f"pyfuser.explain: not a fusion definition: {type(obj).__name__}")


def matches(obj) -> bool:
    from ..frontend.definition import Fusion, FusionDefinition
    from ..ir.fusion import Fusion as IRFusion
    return isinstance(obj, (Fusion, FusionDefinition, IRFusion))


def collect(obj, inputs, options) -> Collected:
    from .fusion_report import expr_text
    fusion, source = _ir_fusion(obj, inputs)
    if len(inputs) != len(fusion.inputs):
        raise PyfuserError(f"pyfuser.explain: the fusion takes {len(fusion.inputs)} inputs, "
                           f"got {len(inputs)}")
    on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    group = GroupSource(0, "fusion", [expr_text(e) for e in fusion.used_exprs()],
                        [v.name for v in fusion.inputs], [v.name for v in fusion.outputs],
                        fusion, list(inputs))
    return Collected(source, "fusion_definition", "cuda" if on_cuda else "cpu",
                     "cuda" if on_cuda else "interpret", [group])
