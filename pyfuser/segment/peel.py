"""Peeling trailing views off kernel groups (a step of segmenter._partition, after the groups
are joined).

A view that joined a kernel group as its last step (every use of its output outside the group)
leaves it again when the rest still schedules; it then runs on the host as a view of the
kernel's output (segmenter._views_on_host). `offer(exprs)` is the segmenter's registry query,
(scheduler, Extracted) or (None, reason).

Invariant: a peel only moves one ViewOp from a kernel group to a group of its own, and only when
the rest is still taken by a scheduler; the group graph stays acyclic (the view's readers were
outside the group already).
"""
from __future__ import annotations

from ..ir import exprs as E


def peel_output_views(groups, verdict: dict, orders, offer) -> None:
    """Peel the trailing views of every kernel group (module docstring): the kernel writes the
    view's input and the view runs on the host. Inside the kernel a view bought nothing (the
    same bytes are written) and could cost much: after a cat or pad it turns the shifted loads
    into div / mod index arithmetic of one element a thread (GPT-2's q/k/v gradient cat before
    the bias gradient's row sum). Chains of views peel one by one. Only from a group that
    writes row-major values (no permute in it, no input known to be laid out otherwise), where
    the host's reshape is a view and not a copy."""
    for g in [g for g in groups.members if verdict[g][0] is not None]:
        while _peel_one_view(groups, verdict, orders, offer, g):
            pass                          # a peel only changes g: the next view of g


def _peel_one_view(groups, verdict: dict, orders, offer, g) -> bool:
    """Peel a trailing view off kernel group g (see peel_output_views); whether one was."""
    members = groups.members[g]
    ids = groups.member_ids(g)
    trailing = [e for e in reversed(members) if type(e) is E.ViewOp and
                id(e.inputs[0].definition) in ids and not any(
                    id(u) in ids for o in e.outputs for u in getattr(o, "uses", []))]
    if len(members) < 2 or not trailing or not _row_major_group(groups, members, orders):
        return False
    for e in trailing:
        rest = [m for m in members if m is not e]
        result = offer(rest)
        if result[0] is not None:
            groups.members[g], verdict[g] = rest, result
            h = max(groups.members) + 1
            groups.members[h], groups.of[id(e)] = [e], h
            verdict[h] = (None, "a view of a kernel's output: runs on the host")
            return True
    return False


def _row_major_group(groups, members, orders) -> bool:
    """No permute among `members` and every input whose order is known (a fusion input, a host
    output) row-major: the kernel's outputs are written row-major (eager's layout of them)."""
    if any(isinstance(e, E.PermuteOp) for e in members):
        return False
    ins, _ = groups.boundary(members)
    return all(id(t) not in orders or orders[id(t)] == list(range(t.ndim)) for t in ins)
