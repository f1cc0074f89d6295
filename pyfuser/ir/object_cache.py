"""`ObjectCache`: a value cached in a Fusion's `__dict__` that belongs to that very object.

Copies and pickles of the Fusion (the codegen deep-copies fusions; the plan cache pickles them)
get an empty `ObjectCache`: what it holds (a segmentation, an analysis keyed by the fusion's own
objects) is never carried to another object or process.
"""
from __future__ import annotations


class ObjectCache:
    __slots__ = ("value",)

    def __init__(self, value=None):
        self.value = value

    def __deepcopy__(self, memo):
        return ObjectCache()

    def __copy__(self):
        return ObjectCache()

    def __reduce__(self):
        return (ObjectCache, ())


def cached_on(fusion, attr: str, compute):
    """`compute(fusion)`, kept in `fusion.__dict__[attr]` (an ObjectCache: dropped by any edit
    of the Fusion, never carried to a copy) and computed again only when missing."""
    holder = fusion.__dict__.get(attr)
    if holder is None or holder.value is None:
        holder = ObjectCache(compute(fusion))
        fusion.__dict__[attr] = holder
    return holder.value
