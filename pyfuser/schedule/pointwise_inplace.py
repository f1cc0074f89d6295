"""In-place outputs a pointwise kernel writes into their input itself.

An in-place output (`Fusion.aliases`, output -> input: the copy_ of a mutated input in an FX
region, an accumulator's update) may be stored straight into its input's storage by the kernel
computing it when no thread reads an element of that input that another thread writes: every
load of the input is at the element the output's store writes (an affine load whose index key
is the store's on every axis: no view, shift, gather or broadcast of the input, which would
make another thread's element read here), and the two have one dtype. Each thread loads its
elements before it stores them. The runtime hands the input out as the output only where the
input's sizes and strides are the ones the output would get (`KernelPlan.allocate_outputs`), so
an element's load and store address the same memory; any other call writes a fresh output,
copied in after the kernels (segment/runtime.apply_aliases). The two pointers lose
`__restrict__` (the emitter reads the schedule's `inplace_tvs`).

The decision reads the index keys only (the Fusion and its size-1 axes: facts of the kernel's
signature), never sizes, so one plan serves every call of its signature.
"""
from __future__ import annotations


def pointwise_inplace(sched, pairs) -> dict:
    """{output index: input index} of the `pairs` ((output index, input index) in the scheduled
    Fusion's numbering) that the kernel of pointwise schedule `sched` writes in place; sets
    `sched.inplace_tvs` (ids of the clone's TensorViews) for the emitter."""
    clone = sched.fusion
    stores = {id(a.tv): a for a in sched.accesses if a.is_store}
    out, tvs = {}, set()
    for oi, ii in pairs:
        o, i = clone.outputs[oi], clone.inputs[ii]
        st = stores.get(id(o))
        if st is None or o.dtype is not i.dtype or o.ndim != i.ndim or not st.node.affine:
            continue
        loads = [a for a in sched.accesses if not a.is_store and a.tv is i]
        if all(_same_element(a, st) for a in loads):
            out[oi] = ii
            tvs |= {id(o), id(i)}
    sched.inplace_tvs = tvs
    return out


def _same_element(load, store) -> bool:
    return load.node.affine and not load.linear and not load.shifts and load.gather is None \
        and load.rng is None and tuple(load.node.key) == tuple(store.node.key)
