"""Scripted modules specialised on their flags: `training` and friends become constants.

A scripted module reads `self.training` (batch norm, dropout), `track_running_stats` and
Optional attributes such as a `bias` that is None through `prim::GetAttr` at run time, so
`if self.training:` stays a branch and batch norm's `training` argument is not a constant:
it could not fuse. `fold_module_flags(g, module)` replaces, in torch graph `g` (the inlined
forward, `%self` first), each `prim::GetAttr` of a **bool** attribute or of an **Optional
attribute that is None**, read from `%self` or a submodule of it, with a constant of its
current value; torch's constant propagation then folds the branches. It returns the guards:
`(torch._C.ScriptModule of the owner, attribute name, value)` for each folded read.

`guards_hold(guards)` checks them (about 0.6 µs per guard through the C++ module): the
compiled graph (jit.CompiledGraph) checks on each call and, when a flag changed
(`model.train()`), builds the graph again for the new values (a few variants are kept).
Numbers (eps, momentum) are not folded: they reach the fuser as host values the groups are
specialised on (lowering.specialised_inputs).
"""
from __future__ import annotations


def _owner(module, path):
    for name in path:
        module = getattr(module, name)
    return module


def _walk(block):
    for n in block.nodes():
        yield n
        for b in n.blocks():
            yield from _walk(b)


def fold_module_flags(g, module) -> list:
    inputs = list(g.inputs())
    if not inputs or inputs[0].type().kind() != "ClassType":
        return []
    paths = {inputs[0].unique(): ()}
    guards, owners = [], {}
    for n in list(_walk(g)):
        if n.kind() != "prim::GetAttr":
            continue
        path = paths.get(n.input().unique())
        if path is None:
            continue
        name, out = n.s("name"), n.output()
        kind = out.type().kind()
        if kind in ("ClassType", "InterfaceType"):
            paths[out.unique()] = path + (name,)
            continue
        if kind not in ("BoolType", "OptionalType"):
            continue
        owner = owners.get(path)
        if owner is None:
            owner = owners[path] = _owner(module, path)
        value = owner._c.getattr(name)
        if kind == "OptionalType" and value is not None:
            continue
        const = g.insertConstant(value)
        const.node().moveBefore(n)
        out.replaceAllUsesWith(const)
        guards.append((owner._c, name, value))
    return guards


def guards_hold(guards) -> bool:
    for cmod, name, value in guards:
        if cmod.getattr(name) is not value:        # bools and None are singletons
            return False
    return True


__all__ = ["fold_module_flags", "guards_hold"]
