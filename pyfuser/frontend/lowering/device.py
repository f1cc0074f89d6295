"""The device a lowering's results are for, where eager's result dtypes or values depend on it.

Eager gives a few ops' outputs another dtype on CUDA than on the CPU: `native_layer_norm`'s mean
and rstd of a half / bfloat16 input are float on CUDA and the input's dtype on the CPU. A
frontend that knows where its graph runs says so around the lowering
(`with lowering_device("cuda"): ...`: the FX frontend from its example values, TorchScript's
`lower_graph` from the first call's inputs); a handler asks `device_type()`, which is None
where the frontend does not know (a graph lowered without example inputs): then such outputs
are not given, and a group that needs them is left to eager.

Values: a CUDA kernel reads a 0-dim CPU tensor operand as a host scalar (TensorIterator's
`is_cpu_scalar`: Dynamo's unspecialised Python floats are such tensors, float64 on the CPU, in
graphs on CUDA), which some ops take at their computation precision rather than the result's
dtype (scalar_operands.py). The frontend names those values: `mark_cpu_scalar(val)` while
lowering, `is_cpu_scalar(val)` in a handler (False where nothing was marked).
"""
from __future__ import annotations

import contextlib
import contextvars

_DEVICE: contextvars.ContextVar = contextvars.ContextVar("pyfuser_lowering_device", default=None)


_CPU_SCALARS: contextvars.ContextVar = contextvars.ContextVar("pyfuser_cpu_scalars",
                                                              default=None)


@contextlib.contextmanager
def lowering_device(device_type):
    """Lowerings inside the block are for `device_type` ("cuda", "cpu" or None: unknown)."""
    token = _DEVICE.set(device_type)
    marks = _CPU_SCALARS.set(set())
    try:
        yield
    finally:
        _CPU_SCALARS.reset(marks)
        _DEVICE.reset(token)


def mark_cpu_scalar(val) -> None:
    """`val` (a lowered 0-dim value) is a CPU tensor in eager, inside the block's lowering."""
    marks = _CPU_SCALARS.get()
    if marks is not None:
        marks.add(id(val))


def is_cpu_scalar(val) -> bool:
    """Whether the frontend marked `val` as a 0-dim CPU tensor (mark_cpu_scalar)."""
    marks = _CPU_SCALARS.get()
    return marks is not None and id(val) in marks


def device_type():
    """The device type of the lowering in progress, or None when the frontend did not say."""
    return _DEVICE.get()


def single_device_type(tensors):
    """The one device type of `tensors`, None when they name none or several: what a frontend
    passes to lowering_device."""
    types = {t.device.type for t in tensors}
    return types.pop() if len(types) == 1 else None
