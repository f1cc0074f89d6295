"""The kernel IR's text form (the `kernel_ir` dump, `PYFUSER_DUMP=kernel_ir`): one line per
statement, loops and conditions indented, expressions in a compact infix form (`fmt`, also used
in the interpreter's messages). A reading aid only: nothing parses it back.
"""
from __future__ import annotations

from . import kernel_ir as K


def format_kernel_ir(k: K.Kernel) -> str:
    """A compact text form of the kernel IR (the `kernel_ir` dump)."""
    lines = [f"Kernel {k.name} (index {k.index_type}, block {k.block}"
             + (f", cluster {k.cluster}" if k.cluster > 1 else "") + ")"]
    for p in k.params:
        lines.append(f"  param {p.ctype} {p.name} <- {p.source[0]}{tuple(p.source[1:]) if p.source[0] != 'scalar' else ''}")

    def emit(stmts, ind):
        for s in stmts:
            pad = "  " * ind
            if isinstance(s, K.Loop):
                lines.append(f"{pad}{s.kind.upper()} {s.var} in [{fmt(s.start)}, {fmt(s.stop)}) step {fmt(s.step)}")
                emit(s.body, ind + 1)
            elif isinstance(s, K.If):
                lines.append(f"{pad}IF {fmt(s.cond)}")
                emit(s.body, ind + 1)
            elif isinstance(s, K.Let):
                lines.append(f"{pad}{s.name} = {fmt(s.expr)}")
            elif isinstance(s, K.Alloc):
                space = " shared" if s.space == "shared" else ""
                lines.append(f"{pad}ALLOC{space} {s.name}{list(s.dims)} : {s.dtype.name}")
            elif isinstance(s, K.Load):
                st = "" if s.stride is None else f" stride {fmt(s.stride)}"
                op = "ASYNC_LOAD" if s.async_copy else "LOAD"
                lines.append(f"{pad}{s.dst}{list(map(fmt, s.index))} = {op}{s.width}{'.' + s.cache if s.cache else ''} {s.ptr}[{fmt(s.offset)}]{st}")
            elif isinstance(s, K.Store):
                st = "" if s.stride is None else f" stride {fmt(s.stride)}"
                lines.append(f"{pad}STORE{s.width}{'.' + s.cache if s.cache else ''} {s.ptr}[{fmt(s.offset)}]{st} = {s.src}{list(map(fmt, s.index))}")
            elif isinstance(s, K.Assign):
                lines.append(f"{pad}{s.name}{list(map(fmt, s.index))} = {fmt(s.expr)}")
            elif isinstance(s, K.VecCopy):
                lines.append(f"{pad}{s.dst}{list(map(fmt, s.dst_index))} = VEC{s.width} "
                             f"{s.src}{list(map(fmt, s.src_index))}")
            elif isinstance(s, K.PackedFill):
                lines.append(f"{pad}{s.dst}[:] = PACKED_FILL {s.value}")
            elif isinstance(s, K.PackedOp):
                lines.append(f"{pad}{s.dst}[:] = PACKED_{s.op.upper()} {s.dst}[:], "
                             f"{s.src}{list(map(fmt, s.src_index))}[:]")
            elif isinstance(s, K.Sync):
                lines.append(f"{pad}SYNC")
            elif isinstance(s, K.AtomicAdd):
                lines.append(f"{pad}{s.dst} = ATOMIC_ADD {s.ptr}[{fmt(s.offset)}] += {fmt(s.value)}")
            elif isinstance(s, K.Fence):
                lines.append(f"{pad}FENCE")
            elif isinstance(s, K.WaitCount):
                lines.append(f"{pad}WAIT {s.ptr}[{fmt(s.offset)}] >= {fmt(s.value)}")
            elif isinstance(s, K.AsyncWait):
                lines.append(f"{pad}ASYNC_WAIT")
            elif isinstance(s, K.ClusterSync):
                lines.append(f"{pad}CLUSTER_{s.phase.upper()}")
            elif isinstance(s, K.MbarInit):
                lines.append(f"{pad}MBAR_INIT {s.name} arrivals {s.count}")
            elif isinstance(s, K.MbarExpect):
                lines.append(f"{pad}MBAR_EXPECT {s.name} += {s.nbytes} bytes")
            elif isinstance(s, K.PushRemote):
                lines.append(f"{pad}{s.dst}{list(map(fmt, s.index))}@rank({fmt(s.rank)}) = "
                             f"PUSH {fmt(s.value)} on {s.mbar}")
            elif isinstance(s, K.MbarWait):
                lines.append(f"{pad}MBAR_WAIT {s.name} parity {fmt(s.parity)}")
            elif isinstance(s, K.Comment):
                lines.append(f"{pad}// {s.text}")

    emit(k.body, 1)
    return "\n".join(lines)


def fmt(e) -> str:
    if isinstance(e, K.Var):
        return e.name
    if isinstance(e, K.Const):
        return repr(e.value)
    if isinstance(e, K.Special):
        return e.name
    if isinstance(e, K.Bin):
        return f"({fmt(e.a)} {e.op} {fmt(e.b)})"
    if isinstance(e, K.ArrayRef):
        return e.name + "".join(f"[{fmt(i)}]" for i in e.index)
    if isinstance(e, K.Op):
        return f"{e.name}({', '.join(fmt(a) for a in e.args)})"
    if isinstance(e, K.Convert):
        return f"{e.kind}<{e.src.name}->{e.dst.name}>({fmt(e.arg)})"
    if isinstance(e, K.Shfl):
        return f"shfl_xor({fmt(e.value)}, {e.lane_xor})"
    if isinstance(e, K.Ballot):
        return f"ballot({fmt(e.pred)})"
    if isinstance(e, K.RemoteRef):
        return f"{e.name}{''.join(f'[{fmt(i)}]' for i in e.index)}@rank({fmt(e.rank)})"
    if isinstance(e, K.Elem):
        return f"{e.ptr}[{fmt(e.offset)}]"
    if isinstance(e, K.CheckedIndex):
        return f"checked({fmt(e.value)} < {fmt(e.size)}, {e.text!r})"
    return str(e)
