"""What `pyfuser.explain` accepts: one collector per frontend, tried in order.

A frontend turns (the user's object, example inputs) into a `Collected`: the program run once
on those inputs, its fusion groups as `GroupSource`s (each a Fusion with the arguments it was
called with, or the reason it runs eagerly), the ops that stayed outside the groups
(`FallbackInfo`s) and the graph around the groups (`Picture`) for the HTML view. The rest of
`explain` (segments, schedulers, kernels: fusion_report.py) is the same for every frontend.

Built in: TorchScript (ts_frontend.py: scripted or traced functions and modules, a torch Graph,
IR text or a .ir path, a `pyfuser.jit` result; a plain function or nn.Module is scripted, or
traced with the example inputs when it does not script) and FusionDefinition (fd_frontend.py:
a FusionDefinition, a pyfuser Fusion, an IR Fusion). A new frontend, such as a torch.compile
backend that hands FX graphs to pyfuser, registers itself with

    register_frontend("fx", matches, collect, first=True)

where `matches(obj) -> bool` and `collect(obj, inputs, options) -> Collected`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import PyfuserError


@dataclass
class GroupSource:
    index: int
    name: str
    ops: list                  # the group's ops as the frontend shows them
    inputs: list
    outputs: list
    fusion: object = None      # the lowered ir.Fusion (None: lowering failed / not run)
    args: list = field(default_factory=list)   # the fusion's inputs of the call explained
    eager_reason: str = ""     # why it runs eagerly ("" when it runs through pyfuser)


@dataclass
class Collected:
    source: str
    frontend: str
    device: str
    executor: str
    groups: list
    fallbacks: list = field(default_factory=list)
    picture: object = None
    notes: list = field(default_factory=list)


_FRONTENDS: list = []


def register_frontend(name: str, matches, collect, first: bool = False) -> None:
    """Add a frontend (see the module docstring); a name already registered is replaced."""
    _FRONTENDS[:] = [f for f in _FRONTENDS if f[0] != name]
    entry = (name, matches, collect)
    if first:
        _FRONTENDS.insert(0, entry)
    else:
        _FRONTENDS.append(entry)


def frontend_names() -> list:
    return [f[0] for f in _FRONTENDS]


def collect(obj, inputs, options: dict) -> Collected:
    for name, matches, fn in _FRONTENDS:
        if matches(obj):
            return fn(obj, inputs, options)
    raise PyfuserError(
        f"pyfuser.explain: cannot explain a {type(obj).__name__}; it takes a TorchScript function "
        "or module (scripted or traced), a Python function or nn.Module (scripted, else traced "
        "with the example inputs), a torch Graph, IR text or a .ir path, a pyfuser.jit result, "
        "a FusionDefinition or a pyfuser Fusion")


def _builtin() -> None:
    from . import fd_frontend, ts_frontend
    register_frontend("fusion_definition", fd_frontend.matches, fd_frontend.collect)
    register_frontend("torchscript", ts_frontend.matches, ts_frontend.collect)


_builtin()
