"""The interpreter's global-memory race check (codegen/interpreter_global.py): small hand-built
kernels whose result on a GPU would depend on the order threads run in are flagged, their fixed
versions pass, and the cross-block patterns of the generated kernels (a ticket with a fence, a
wait on a count) are ordered rather than flagged."""
import types

import pytest
import torch

from pyfuser.codegen import interpreter
from pyfuser.codegen import interpreter_global
from pyfuser.codegen import kernel_ir as K
from pyfuser.codegen.interpreter import Interpreter, KernelRaceError
from pyfuser.codegen.kernel import LaunchConfig, Param
from pyfuser.ir.dtypes import DataType

F, I = DataType.Float, DataType.Int32
C = lambda v: K.Const(v, "nidx_t")  # noqa: E731
tx, bx = K.Special("threadIdx.x"), K.Special("blockIdx.x")
first = K.Bin("==", tx, C(0))


def kernel(name, body, block, tensors):
    params = [Param(n, "void*", ("ptr", i)) for i, (n, _, _) in enumerate(tensors)]
    tp = {n: K.TensorParam(n, dt, i, out) for i, (n, dt, out) in enumerate(tensors)}
    return K.Kernel(name, params, tp, "int", block, body)


def interpret(k, tensors, grid, racecheck=True):
    Interpreter(types.SimpleNamespace(kernel_ir=k), tensors, None, racecheck=racecheck).run(
        LaunchConfig(grid, k.block))


def gid(T):
    return K.add(K.mul(bx, C(T)), tx)


def test_two_threads_writing_one_element_are_flagged():
    """Every thread of every block stores its value into out[0] (in one statement)."""
    def build(guard):
        store = [K.Alloc("v", F, ()), K.Load("v", (), "x", gid(32), 1),
                 K.Store("out", C(0), "v", (), 1)]
        body = [K.If(K.Bin("==", K.add(tx, bx), C(0)), store)] if guard else store
        return kernel("pf_race_ww", body, (32, 1, 1), [("x", F, False), ("out", F, True)])
    x, out = torch.arange(64.0), torch.zeros(1)
    with pytest.raises(KernelRaceError, match=r"pf_race_ww: global race on out\[0\]: written by "
                       r"block \(0,0,0\) thread \(0,0,0\) and by block \(1,0,0\) thread \(31,0,0\) "
                       "in the same statement"):
        interpret(build(False), [x, out], (2, 1, 1))
    interpret(build(True), [x, out], (2, 1, 1))
    assert float(out) == 0.0


def test_two_blocks_writing_one_element_in_different_statements_are_flagged():
    """Block 0 writes out[0] in one statement, block 1 in a later one: lockstep order on the
    CPU, any order on a GPU."""
    v = [K.Alloc("v", F, ()), K.Load("v", (), "x", bx, 1)]
    body = v + [K.If(K.Bin("==", K.add(tx, bx), C(0)), [K.Store("out", C(0), "v", (), 1)]),
                K.If(_and(first, K.Bin("==", bx, C(1))), [K.Store("out", C(0), "v", (), 1)])]
    k = kernel("pf_race_ww2", body, (32, 1, 1), [("x", F, False), ("out", F, True)])
    with pytest.raises(KernelRaceError, match=r"out\[0\]: written by block \(0,0,0\) thread "
                       r"\(0,0,0\) and written by block \(1,0,0\) thread \(0,0,0\)"):
        interpret(k, [torch.arange(2.0), torch.zeros(1)], (2, 1, 1))


def _and(a, b):
    return K.Bin("&&", a, b)


def shift_kernel(in_place):
    """x[i] = x[i + 1] (i < n - 1): in place, thread i reads the element thread i + 1 writes;
    the lockstep interpreter (every load before every store) still gives eager's shift."""
    n = K.Var("n")
    dst = "x" if in_place else "out"
    body = [K.If(K.Bin("<", K.add(gid(32), C(1)), n),
                 [K.Alloc("v", F, ()), K.Load("v", (), "x", K.add(gid(32), C(1)), 1),
                  K.Store(dst, gid(32), "v", (), 1)])]
    tensors = [("x", F, in_place)] + ([] if in_place else [("out", F, True)])
    k = kernel("pf_race_shift", body, (32, 1, 1), tensors)
    k.params.append(Param("n", "int", ("size", 0, 0)))
    return k


def test_in_place_neighbour_read_is_flagged_and_out_of_place_passes():
    x = torch.arange(64.0)
    ref = x.clone()
    ref[:-1] = x[1:]
    y = x.clone()
    interpret(shift_kernel(True), [y], (2, 1, 1), racecheck=False)
    assert torch.equal(y, ref)                       # what hid the race: eager's answer on the CPU
    with pytest.raises(KernelRaceError, match=r"pf_race_shift: global race on x\[1\]: read by "
                       r"block \(0,0,0\) thread \(0,0,0\) and written by block \(0,0,0\) thread \(1,0,0\)"):
        interpret(shift_kernel(True), [x.clone()], (2, 1, 1))
    out = torch.zeros(64)
    interpret(shift_kernel(False), [x, out], (2, 1, 1))
    assert torch.equal(out[:-1], x[1:])


def test_races_across_chunks_are_flagged(monkeypatch):
    """The chunks run one after the other on the CPU; a race between blocks of different chunks
    (block 0 reads what the last block writes) is found all the same."""
    monkeypatch.setattr(interpreter, "ELEMENT_BUDGET", 64)
    body = [K.Alloc("v", F, ()),
            K.If(_and(first, K.Bin("==", bx, C(0))), [K.Load("v", (), "x", C(0), 1)]),
            K.If(_and(first, K.Bin("==", bx, C(7))), [K.Store("x", C(0), "v", (), 1)])]
    k = kernel("pf_race_chunks", body, (32, 1, 1), [("x", F, True)])
    with pytest.raises(KernelRaceError, match=r"read by block \(0,0,0\) thread \(0,0,0\) and "
                       r"written by block \(7,0,0\) thread \(0,0,0\)"):
        interpret(k, [torch.zeros(1)], (8, 1, 1))


def block_exchange_kernel(with_sync):
    """Each thread writes out[i]; then thread t reads out[i ^ 1] (a neighbour of its block)
    and writes it to res[i]: ordered by a Sync, a race without."""
    body = [K.Alloc("v", F, ()), K.Load("v", (), "x", gid(32), 1), K.Store("out", gid(32), "v", (), 1)]
    if with_sync:
        body.append(K.Sync())
    body += [K.Load("v", (), "out", K.Bin("^", gid(32), C(1)), 1), K.Store("res", gid(32), "v", (), 1)]
    return kernel("pf_race_sync", body, (32, 1, 1), [("x", F, False), ("out", F, True), ("res", F, True)])


def test_global_read_of_a_neighbour_needs_a_barrier():
    x = torch.arange(64.0)
    with pytest.raises(KernelRaceError, match=r"out\[1\]: written by block \(0,0,0\) thread "
                       r"\(1,0,0\) and read by block \(0,0,0\) thread \(0,0,0\)"):
        interpret(block_exchange_kernel(False), [x, torch.zeros(64), torch.zeros(64)], (2, 1, 1))
    res = torch.zeros(64)
    interpret(block_exchange_kernel(True), [x, torch.zeros(64), res], (2, 1, 1))
    assert torch.equal(res, x.view(-1, 2).flip(1).reshape(-1))


def test_shared_memory_read_without_a_barrier_is_flagged():
    """The shared-memory check (interpreter_shared.py), always on: thread t reads sm[t ^ 1]."""
    def build(with_sync):
        body = [K.Alloc("sm", F, (32,), "shared"), K.Alloc("v", F, ()),
                K.Load("v", (), "x", tx, 1), K.Assign("sm", (tx,), K.ArrayRef("v", ()))]
        body += [K.Sync()] if with_sync else []
        body += [K.Assign("v", (), K.ArrayRef("sm", (K.Bin("^", tx, C(1)),))),
                 K.Store("out", tx, "v", (), 1)]
        return kernel("pf_race_sm", body, (32, 1, 1), [("x", F, False), ("out", F, True)])
    x, out = torch.arange(32.0), torch.zeros(32)
    with pytest.raises(KernelRaceError, match="no __syncthreads"):
        interpret(build(False), [x, out], (1, 1, 1))
    interpret(build(True), [x, out], (1, 1, 1))
    assert torch.equal(out, x.view(-1, 2).flip(1).reshape(-1))


def ticket_kernel(fence=True, ticket=True):
    """Grid sum: each block's thread 0 writes its value into ws[b], fences, and counts itself
    in; the block that arrives last reads every partial, writes the sum and resets the counter
    (the reduction_outer / inner_outer pattern). Without the fence or the ticket the partials'
    reads race with their writes."""
    nb = K.Special("gridDim.x")
    body = [K.Alloc("v", F, ()), K.Alloc("last", DataType.Bool, (), "shared"),
            K.If(first, [K.Load("v", (), "x", bx, 1), K.Store("ws", bx, "v", (), 1)])]
    body += [K.Fence()] if fence else []
    if ticket:
        body += [K.Sync(), K.If(first, [K.AtomicAdd("old", "sem", C(0), C(1)),
                                        K.Assign("last", (), K.Bin("==", K.Var("old"),
                                                                   K.Bin("-", nb, C(1))))]),
                 K.Sync()]
        cond = K.ArrayRef("last", ())
    else:
        cond = K.Bin("==", bx, K.Bin("-", nb, C(1)))
    acc = [K.Alloc("s", F, ()), K.Assign("s", (), K.Const(0.0, "float", F)),
           K.Loop("z", C(0), nb, C(1), "serial",
                  [K.Load("v", (), "ws", K.Var("z"), 1, None, "cg"),
                   K.Assign("s", (), K.Op("add", (K.ArrayRef("s", ()), K.ArrayRef("v", ())), F))]),
           K.Store("out", C(0), "s", (), 1),
           K.Alloc("zero", I, ()), K.Assign("zero", (), C(0)), K.Store("sem", C(0), "zero", (), 1)]
    body += [K.If(cond, [K.Fence(), K.If(first, acc)])]
    return kernel("pf_race_ticket", body, (32, 1, 1),
                  [("x", F, False), ("ws", F, True), ("sem", I, True), ("out", F, True)])


def test_ticket_with_fence_is_ordered():
    x = torch.arange(1.0, 8.0)
    ws, sem, out = torch.zeros(7), torch.zeros(1, dtype=torch.int32), torch.zeros(1)
    interpret(ticket_kernel(), [x, ws, sem, out], (7, 1, 1))
    assert float(out) == float(x.sum()) and int(sem) == 0


@pytest.mark.parametrize("fence,ticket", [(False, True), (True, False)])
def test_ticket_without_fence_or_atomic_is_flagged(fence, ticket):
    x = torch.arange(1.0, 8.0)
    ws, sem, out = torch.zeros(7), torch.zeros(1, dtype=torch.int32), torch.zeros(1)
    with pytest.raises(KernelRaceError, match=r"global race on ws\[0\]: written by block \(0,0,0\) "
                       r"thread \(0,0,0\) and read by block \(6,0,0\) thread \(0,0,0\)"):
        interpret(ticket_kernel(fence, ticket), [x, ws, sem, out], (7, 1, 1))


def test_plain_write_of_a_counter_others_update_is_flagged():
    """The counter reset by a block that is not the last: other blocks' atomics are unordered
    with it."""
    body = [K.If(first, [K.AtomicAdd("old", "sem", C(0), C(1))]),
            K.If(_and(first, K.Bin("==", bx, C(0))),
                 [K.Alloc("zero", I, ()), K.Assign("zero", (), C(0)), K.Store("sem", C(0), "zero", (), 1)])]
    k = kernel("pf_race_reset", body, (32, 1, 1), [("sem", I, True)])
    with pytest.raises(KernelRaceError, match=r"sem\[0\]: accessed atomically by block \(2,0,0\) "
                       r"thread \(0,0,0\) and written by block \(0,0,0\) thread \(0,0,0\)"):
        interpret(k, [torch.zeros(1, dtype=torch.int32)], (3, 1, 1))


def test_wait_count_orders_every_block_before_the_waiters():
    """Every block writes ws[b], fences and arrives; block 0 waits for all, then reads them."""
    nb = K.Special("gridDim.x")
    body = [K.Alloc("v", F, ()),
            K.If(first, [K.Load("v", (), "x", bx, 1), K.Store("ws", bx, "v", (), 1)]),
            K.Fence(), K.Sync(), K.If(first, [K.AtomicAdd("old", "sem", C(0), C(1))]),
            K.If(K.Bin("==", bx, C(0)),
                 [K.If(first, [K.WaitCount("sem", C(0), nb)]), K.Fence(), K.Sync(),
                  K.If(K.Bin("<", tx, nb), [K.Load("v", (), "ws", tx, 1), K.Store("out", tx, "v", (), 1)])])]
    k = kernel("pf_race_wait", body, (32, 1, 1),
               [("x", F, False), ("ws", F, True), ("sem", I, True), ("out", F, True)])
    x, out = torch.arange(1.0, 5.0), torch.zeros(4)
    interpret(k, [x, torch.zeros(4), torch.zeros(1, dtype=torch.int32), out], (4, 1, 1))
    assert torch.equal(out, x)


def test_switched_on_by_the_environment(monkeypatch):
    monkeypatch.setenv(interpreter_global.RACECHECK_ENV, "1")
    with pytest.raises(KernelRaceError):
        Interpreter(types.SimpleNamespace(kernel_ir=shift_kernel(True)), [torch.arange(64.0)], None).run(
            LaunchConfig((2, 1, 1), (32, 1, 1)))
    monkeypatch.setenv(interpreter_global.RACECHECK_ENV, "0")
    Interpreter(types.SimpleNamespace(kernel_ir=shift_kernel(True)), [torch.arange(64.0)], None).run(
        LaunchConfig((2, 1, 1), (32, 1, 1)))


def test_an_output_broadcast_along_the_rows_is_stored_by_one_row(monkeypatch):
    """Found by the check (T5's attention bias in test_compile_training: softmax(scores + bias)
    with the bias [1, q, k] an output of the same reduction kernel): every batch row of the
    block computed the bias' element and stored it, two threads writing one element; now only
    batch index 0 stores it (ReductionLowering.owner)."""
    import sys
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from codegen_cases import B, make_fusion, run_plan

    def build():
        x = B.define_tensor([-1, -1, -1], F)
        b = B.define_tensor([1, -1, -1], F)
        return [B.reduction("sum", B.elementwise("add", x, b), [2]), B.elementwise("neg", b)]
    x, b = torch.randn(2, 8, 16), torch.randn(1, 8, 16)
    monkeypatch.setenv(interpreter_global.RACECHECK_ENV, "1")
    plan, outs = run_plan(make_fusion(build), [x, b])
    torch.testing.assert_close(outs[0], (x + b).sum(2))
    assert torch.equal(outs[1], -b)
    assert "if ((g0 == 0)) {" in plan.kernel.source


def running_stat_kernel(with_sync):
    """An in-place per-block value (a running statistic): every thread of block b reads
    stat[b], then thread 0 writes stat[b] + 1 back: the write must wait for the block's reads."""
    body = [K.Alloc("v", F, ()), K.Load("v", (), "stat", bx, 1),
            K.Store("out", gid(32), "v", (), 1)]
    body += [K.Sync()] if with_sync else []
    body += [K.If(first, [K.Assign("v", (), K.Op("add", (K.ArrayRef("v", ()), K.Const(1.0, "float", F)), F)),
                          K.Store("stat", bx, "v", (), 1)])]
    return kernel("pf_race_stat", body, (32, 1, 1), [("stat", F, True), ("out", F, True)])


def test_in_place_per_block_update_needs_a_barrier_after_the_block_reads():
    stat = torch.tensor([1.0, 2.0])
    with pytest.raises(KernelRaceError, match=r"stat\[0\]: read by several threads of one block, as "
                       r"block \(0,0,0\) thread \(31,0,0\) and written by block \(0,0,0\) thread \(0,0,0\)"):
        interpret(running_stat_kernel(False), [stat.clone(), torch.zeros(64)], (2, 1, 1))
    out = torch.zeros(64)
    interpret(running_stat_kernel(True), [stat, out], (2, 1, 1))
    assert torch.equal(stat, torch.tensor([2.0, 3.0]))
    assert torch.equal(out, torch.tensor([1.0, 2.0]).repeat_interleave(32))


def cluster_handoff_kernel(barrier):
    """Blocks of a cluster of 2: rank 0 writes its cluster's global element, rank 1 reads it.
    `barrier`: None (nothing between: a race), "sync" (a cluster barrier between: ordered),
    "split" (the write before a split barrier's arrive, the read after its wait: ordered),
    "late" (the write between the arrive and the wait: a race)."""
    rank = K.Special("cluster_rank")
    cl = K.Bin("/", bx, C(2))
    write = [K.If(_and(first, K.Bin("==", rank, C(0))),
                  [K.Load("v", (), "x", cl, 1), K.Store("mid", cl, "v", (), 1)])]
    arrive, wait = K.ClusterSync("arrive"), K.ClusterSync("wait")
    body = [K.Alloc("v", F, ())] + {None: write, "sync": write + [K.ClusterSync()],
                                    "split": write + [arrive, wait],
                                    "late": [arrive] + write + [wait]}[barrier]
    body += [K.If(_and(first, K.Bin("==", rank, C(1))),
                  [K.Load("v", (), "mid", cl, 1), K.Store("out", cl, "v", (), 1)])]
    k = kernel("pf_race_cluster", body, (32, 1, 1), [("x", F, False), ("mid", F, True), ("out", F, True)])
    k.cluster = 2
    return k


@pytest.mark.parametrize("racy,ordered", [(None, "sync"), ("late", "split")])
def test_cluster_barrier_orders_global_memory_between_its_blocks(racy, ordered):
    """A whole cluster barrier orders the write before the read; a split one only a write
    before its arrive."""
    x = torch.arange(1.0, 4.0)
    with pytest.raises(KernelRaceError, match=r"mid\[0\]: written by block \(0,0,0\) thread \(0,0,0\) "
                       r"and read by block \(1,0,0\) thread \(0,0,0\)"):
        interpret(cluster_handoff_kernel(racy), [x, torch.zeros(3), torch.zeros(3)], (6, 1, 1))
    out = torch.zeros(3)
    interpret(cluster_handoff_kernel(ordered), [x, torch.zeros(3), out], (6, 1, 1))
    assert torch.equal(out, x)
