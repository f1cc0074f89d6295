"""Mbarriers and pushes into other blocks' shared memory (kernel IR MbarInit / MbarExpect /
PushRemote / MbarWait; the interpreter's model and checks: codegen/interpreter_mbarrier.py).

A hand-built kernel, a cluster of 2 blocks: each block pushes a value into slot [own rank] of
both blocks' shared memory, waits on its own mbarrier and adds the two slots; run in the
interpreter against torch, printed and compiled with NVRTC for sm_90. Each way of breaking the
protocol (no init, a push before the init is published, a read before the wait, too few or too
many bytes expected, a slot pushed again without a cluster barrier, a push never waited for) is
caught by the interpreter."""
import pytest
import torch

from pyfuser.codegen import kernel_ir as K
from pyfuser.codegen import kernel_ir_format as KF
from pyfuser.codegen.cuda import full_source
from pyfuser.codegen.interpreter import KernelRaceError
from pyfuser.ir.dtypes import DataType
from test_kernel_ir import C, compiles, interpret, kernel, tx

F = DataType.Float
bx = K.Special("blockIdx.x")
rank = K.Special("cluster_rank")
first = K.Bin("==", tx, C(0))


def push_kernel(rounds=1, fault=None):
    """Round r: every thread of block b loads x[((b // 2) * rounds + r) * 2 + rank] (its
    cluster's value for its rank and the round), lanes 0 and 1 push it into slot [rank] of ranks 0 and 1, every thread
    waits (parity r % 2) and adds both slots into acc; out[b] = acc. Between rounds a cluster
    barrier (the slots are pushed again). `fault` names the one thing left out or wrong."""
    expect = {"short": 4, "long": 12}.get(fault, 8)
    body = [K.Alloc("bar", DataType.Int, (), "shared"), K.Alloc("slot", F, (2,), "shared"),
            K.Alloc("v", F, ()), K.Alloc("acc", F, ()), K.Assign("acc", (), K.Const(0.0, "float", F))]
    if fault != "no_init":
        body.append(K.If(first, [K.MbarInit("bar", 1)]))
    if fault != "unpublished":
        body.append(K.ClusterSync())
    cl = K.Bin("/", bx, C(2))
    for r in range(rounds):
        src = K.add(K.mul(K.add(K.mul(cl, C(rounds)), C(r)), C(2)), rank)
        push = [K.If(first, [K.MbarExpect("bar", expect)]),
                K.PushRemote("slot", (rank,), tx, K.ArrayRef("v", ()), F, "bar")]
        body += [K.Load("v", (), "x", src, 1), K.If(K.Bin("<", tx, C(2)), push)]
        if fault == "never_waited":
            continue
        if fault != "no_wait":
            body.append(K.MbarWait("bar", C(r % 2)))
        body.append(K.Assign("acc", (), K.Op("add", (K.ArrayRef("acc", ()), K.Op(
            "add", (K.ArrayRef("slot", (C(0),)), K.ArrayRef("slot", (C(1),))), F)), F)))
        if r + 1 < rounds and fault != "no_barrier_between":
            body.append(K.ClusterSync())
    body.append(K.If(first, [K.Store("out", bx, "acc", (), 1)]))
    k = kernel("pf_test_push", body, (32, 1, 1), [("x", F, False), ("out", F, True)])
    k.cluster = 2
    return k


@pytest.mark.parametrize("rounds", [1, 2])
def test_pushed_partials_are_summed_in_every_block(rounds):
    x = torch.arange(6.0 * rounds) ** 2
    out = torch.full((6,), float("nan"))
    interpret(push_kernel(rounds), [x, out], (6, 1, 1))
    want = x.view(3, rounds, 2).sum((1, 2)).repeat_interleave(2)
    assert torch.equal(out, want)


def test_push_kernel_prints_and_compiles():
    k = push_kernel(2)
    src = full_source(k)
    body = src[src.index('extern "C"'):]
    assert "pf_mbar_init(&bar, 1u);" in body and "pf_mbar_expect(&bar, 8u);" in body
    assert body.count("pf_push<float>(&slot[") == 2 and body.count("pf_mbar_wait(&bar, ") == 2
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in src
    assert "MBAR_WAIT bar parity 1" in KF.format_kernel_ir(k)
    compiles(k)


@pytest.mark.parametrize("fault,rounds,match", [
    ("no_init", 1, "used before its MbarInit"),
    ("unpublished", 1, "before its init was published"),
    ("no_wait", 1, "read before the async copy or push"),
    ("short", 1, "more bytes pushed"),
    ("long", 1, "never completes"),
    ("no_barrier_between", 2, "pushed to after another write"),
    ("never_waited", 1, "never waited for")])
def test_broken_protocols_are_caught(fault, rounds, match):
    with pytest.raises(KernelRaceError, match=match):
        interpret(push_kernel(rounds, fault), [torch.arange(12.0), torch.empty(6)], (6, 1, 1))


def test_pushes_are_four_or_eight_bytes():
    with pytest.raises(ValueError, match="not 4 or 8 bytes"):
        K.PushRemote("slot", (C(0),), C(0), C(0), DataType.Half, "bar")


def test_an_init_after_the_arrive_is_not_published():
    """A split cluster barrier publishes only the inits made before its arrive."""
    k = push_kernel(1, "unpublished")
    k.body[5:5] = [K.ClusterSync("arrive")]          # before the init ...
    k.body.insert(7, K.ClusterSync("wait"))           # ... its wait after it
    assert isinstance(k.body[6], K.If) and isinstance(k.body[6].body[0], K.MbarInit)
    with pytest.raises(KernelRaceError, match="before its init was published"):
        interpret(k, [torch.arange(12.0), torch.empty(6)], (6, 1, 1))
    k.body[5], k.body[6] = k.body[6], k.body[5]     # init, arrive, wait: published
    out = torch.empty(6)
    interpret(k, [torch.arange(6.0), out], (6, 1, 1))
    assert torch.equal(out, torch.arange(6.0).view(3, 2).sum(1).repeat_interleave(2))


def split_reuse_kernel(early: bool):
    """Two rounds into the same slots, ordered by a split cluster barrier: the arrive after
    round 0's reads and a block barrier (correct), or `early`, before them (the next round's
    pushes may then land while a block still reads: a race the GPU would have)."""
    k = push_kernel(2)
    body = k.body
    between = next(n for n, s in enumerate(body) if isinstance(s, K.ClusterSync) and n > 6)
    reads = between - 1                                    # round 0's Assign of acc
    assert isinstance(body[reads], K.Assign) and body[reads].name == "acc"
    if early:
        body[between:between + 1] = [K.Sync(), K.ClusterSync("wait")]
        body.insert(reads - 1, K.ClusterSync("arrive"))    # before round 0's wait and reads
    else:
        body[between:between + 1] = [K.Sync(), K.ClusterSync("arrive"), K.ClusterSync("wait")]
    return k


def test_a_split_barrier_orders_pushes_only_after_its_arrive():
    x = torch.arange(12.0) ** 2
    out = torch.empty(6)
    interpret(split_reuse_kernel(False), [x, out], (6, 1, 1))
    assert torch.equal(out, x.view(3, 2, 2).sum((1, 2)).repeat_interleave(2))
    with pytest.raises(KernelRaceError, match="pushed to while another thread's access"):
        interpret(split_reuse_kernel(True), [x, torch.empty(6)], (6, 1, 1))


def test_a_push_before_the_arrive_is_ordered_but_not_one_after():
    """The first round's push after an early arrive (init, sync, arrive, round 0, Sync, wait,
    round 1): its record is younger than the arrive, so the wait does not order it before the
    next round's push."""
    k = push_kernel(2)
    body = k.body
    between = next(n for n, s in enumerate(body) if isinstance(s, K.ClusterSync) and n > 6)
    body[between:between + 1] = [K.Sync(), K.ClusterSync("wait")]
    first_load = next(n for n, s in enumerate(body) if isinstance(s, K.Load))
    body.insert(first_load, K.ClusterSync("arrive"))
    with pytest.raises(KernelRaceError, match="pushed to after another write"):
        interpret(k, [torch.arange(12.0), torch.empty(6)], (6, 1, 1))
