"""codegen/kernel_ir_rename.py: renamed copies of kernel IR."""
import pytest

from pyfuser.codegen import kernel_ir as K
from pyfuser.codegen.kernel_ir_rename import Rename, defined_names
from pyfuser.errors import SchedulerError
from pyfuser.ir.dtypes import DataType


def _body():
    c = lambda v: K.Const(v, "nidx_t")   # noqa: E731
    return [K.Let("row", "nidx_t", K.add(K.Var("rb"), K.Special("threadIdx.y"))),
            K.Loop("s", c(0), c(2), c(1), "unroll", [
                K.Let("j", "nidx_t", K.mul(K.Var("s"), K.Special("threadIdx.x"))),
                K.If(K.Bin("<", K.Var("j"), K.Var("rlen")), [
                    K.Load("buf", (K.Var("s"), K.Var("v")), "T0", K.Var("j"), 4,
                           async_copy=True)])]),
            K.AsyncWait()]


def test_names_defined_inside_are_renamed_and_the_rest_kept():
    body = _body()
    inside = defined_names(body)
    assert inside == {"row", "s", "j"}
    keep = {"buf", "T0", "rlen"}
    out = Rename(lambda n: n + "_n" if n in inside or n == "rb" else n).block(body)
    assert out[0].name == "row_n" and out[0].expr.a == K.Var("rb_n")
    loop = out[1]
    assert loop.var == "s_n" and loop.body[0].name == "j_n"
    load = loop.body[1].body[0]
    assert load.dst == "buf" and load.ptr == "T0" and load.async_copy
    assert load.index == (K.Var("s_n"), K.Var("v"))          # the lanes index stays `v`
    assert loop.body[1].cond == K.Bin("<", K.Var("j_n"), K.Var("rlen"))
    assert isinstance(out[2], K.AsyncWait)
    assert body[1].var == "s" and body[1].body is not loop.body    # the original is untouched
    assert not keep & {out[0].name, loop.var}


def test_specials_are_replaced_and_strict_refuses_others():
    hb = K.Var("hb")
    out = Rename(lambda n: "c0_" + n, {"threadIdx.y": hb}).block(_body()[:1])
    assert out[0].expr == K.add(K.Var("c0_rb"), hb)
    with pytest.raises(SchedulerError, match="reads threadIdx.x"):
        Rename(lambda n: n, {"threadIdx.y": hb}, strict=True).block(_body())


def test_unknown_statement_kinds_are_refused():
    class Odd:
        pass
    with pytest.raises(SchedulerError, match="cannot rename a Odd"):
        Rename(lambda n: n).block([Odd()])
    assert Rename(lambda n: n).s(K.Alloc("a", DataType.Float, (4,), "shared")).name == "a"
