"""Kernel IR primitives beyond pointwise code: shared memory, barriers, warp shuffles, mutable
scalars, runtime loops, 2-D blocks and atomics. Each hand-built kernel runs in the CPU
interpreter against a torch result and compiles with NVRTC for sm_90; kernels with a missing
barrier or a divergent barrier / shuffle are caught by the interpreter's race checks."""
import types

import pytest
import torch

from pyfuser.codegen import kernel_ir as K
from pyfuser.codegen.cuda import full_source
from pyfuser.codegen.interpreter import Interpreter, KernelRaceError
from pyfuser.codegen.kernel import LaunchConfig, Param
from pyfuser.ir.dtypes import DataType

F = DataType.Float
C = lambda v: K.Const(v, "nidx_t")  # noqa: E731
tx, ty, bx = K.Special("threadIdx.x"), K.Special("threadIdx.y"), K.Special("blockIdx.x")


def kernel(name, body, block, tensors, extra_params=()):
    params = [Param(n, "void*", ("ptr", i)) for i, (n, _, _) in enumerate(tensors)]
    params += list(extra_params)
    tp = {n: K.TensorParam(n, dt, i, out) for i, (n, dt, out) in enumerate(tensors)}
    return K.Kernel(name, params, tp, "int", block, body)


def interpret(k, tensors, grid):
    Interpreter(types.SimpleNamespace(kernel_ir=k), tensors, None).run(LaunchConfig(grid, k.block))


def compiles(k):
    nvrtc = pytest.importorskip("pyfuser.runtime.nvrtc")
    pytest.importorskip("cuda.bindings.nvrtc")
    nvrtc.compile_cuda(full_source(k), k.name, "sm_90", use_disk_cache=False)


def block_sum_kernel(T, with_sync=True):
    """out[b] = sum of x[b*T : (b+1)*T]: each thread stores into shared memory, then a tree."""
    body = [K.Alloc("sm", F, (T,), "shared"),
            K.Alloc("v", F, ()),
            K.Load("v", (), "x", K.add(K.mul(bx, C(T)), tx), 1),
            K.Assign("sm", (tx,), K.ArrayRef("v", ()))]
    step = T // 2
    while step >= 1:
        if with_sync:
            body.append(K.Sync())
        body.append(K.If(K.Bin("<", tx, C(step)),
                         [K.Assign("sm", (tx,), K.Op("add", (K.ArrayRef("sm", (tx,)),
                                                             K.ArrayRef("sm", (K.add(tx, C(step)),))), F))]))
        step //= 2
    body.append(K.If(K.Bin("==", tx, C(0)), [K.Store("out", bx, "sm", (C(0),), 1)]))
    return kernel("pf_test_block_sum", body, (T, 1, 1), [("x", F, False), ("out", F, True)])


def test_shared_tree_sum_with_barriers():
    T, nb = 64, 5
    x = torch.arange(T * nb, dtype=torch.float32)
    out = torch.full((nb,), float("nan"))
    k = block_sum_kernel(T)
    interpret(k, [x, out], (nb, 1, 1))
    assert torch.equal(out, x.view(nb, T).sum(1))
    src = full_source(k)
    assert "__shared__ float sm[64];" in src and src.count("__syncthreads();") == 6
    compiles(k)


def test_missing_barrier_is_a_race():
    k = block_sum_kernel(64, with_sync=False)
    with pytest.raises(KernelRaceError, match="no __syncthreads"):
        interpret(k, [torch.randn(128), torch.empty(2)], (2, 1, 1))


def test_divergent_barrier_is_caught():
    body = [K.Alloc("sm", F, (32,), "shared"),
            K.If(K.Bin("<", tx, C(16)), [K.Sync()])]
    k = kernel("pf_test_divergent", body, (32, 1, 1), [("x", F, False)])
    with pytest.raises(KernelRaceError, match="part of a block"):
        interpret(k, [torch.randn(1)], (1, 1, 1))


def test_warp_butterfly_gives_every_lane_the_sum():
    """xor shuffles 16..1: every lane ends with its warp's sum (a mutable scalar accumulator)."""
    body = [K.Alloc("acc", F, ()),
            K.Load("acc", (), "x", K.add(K.mul(bx, C(64)), tx), 1)]
    for m in (16, 8, 4, 2, 1):
        body.append(K.Assign("acc", (), K.Op("add", (K.ArrayRef("acc", ()),
                                                      K.Shfl(K.ArrayRef("acc", ()), m, F)), F)))
    body.append(K.Store("out", K.add(K.mul(bx, C(64)), tx), "acc", (), 1))
    k = kernel("pf_test_shfl", body, (64, 1, 1), [("x", F, False), ("out", F, True)])
    x = torch.randint(-50, 50, (3 * 64,)).float()
    out = torch.empty_like(x)
    interpret(k, [x, out], (3, 1, 1))
    assert torch.equal(out, x.view(6, 32).sum(1).repeat_interleave(32))
    assert "__shfl_xor_sync(0xffffffffu, acc, 16)" in full_source(k)
    compiles(k)


def test_shuffle_in_part_of_a_warp_is_caught():
    body = [K.Alloc("acc", F, ()),
            K.If(K.Bin("<", tx, C(8)),
                 [K.Assign("acc", (), K.Shfl(K.ArrayRef("acc", ()), 1, F))])]
    k = kernel("pf_test_shfl_div", body, (32, 1, 1), [("x", F, False)])
    with pytest.raises(KernelRaceError, match="part of a warp"):
        interpret(k, [torch.randn(1)], (1, 1, 1))


def test_2d_block_and_serial_runtime_loop():
    """A (8, 4) block: threadIdx.y walks rows with a per-thread runtime loop (start ty, step 4)."""
    rows, cols = 11, 8
    body = [K.Loop("r", ty, K.Var("nrows"), C(4), "serial",
                   [K.Let("i", "nidx_t", K.add(K.mul(K.Var("r"), C(cols)), tx)),
                    K.Alloc("v", F, ()),
                    K.Load("v", (), "x", K.Var("i"), 1),
                    K.Assign("v", (), K.Op("mul", (K.ArrayRef("v", ()), K.Const(2.0, "float", F)), F)),
                    K.Store("out", K.Var("i"), "v", (), 1)])]
    k = kernel("pf_test_2d", body, (cols, 4, 1), [("x", F, False), ("out", F, True)],
               [Param("nrows", "int", ("size", 0, 0))])
    x = torch.randn(rows, cols)
    out = torch.full_like(x, float("nan"))
    Interpreter(types.SimpleNamespace(kernel_ir=k), [x, out], None).run(
        LaunchConfig((1, 1, 1), (cols, 4, 1)))
    assert torch.equal(out, x * 2)
    assert "__launch_bounds__(32)" in full_source(k)
    compiles(k)


def test_atomic_counter_finds_the_last_block():
    """Each block adds 1 to a counter; the block that sees nb - 1 is the last and writes nb."""
    I = DataType.Int32
    body = [K.If(K.Bin("==", tx, C(0)),
                 [K.Fence(), K.AtomicAdd("old", "sem", C(0), C(1)),
                  K.If(K.Bin("==", K.Var("old"), K.Bin("-", K.Special("gridDim.x"), C(1))),
                       [K.Alloc("n", I, ()), K.Assign("n", (), K.Special("gridDim.x")),
                        K.Store("out", C(0), "n", (), 1)])])]
    k = kernel("pf_test_atomic", body, (32, 1, 1), [("sem", I, True), ("out", I, True)])
    sem, out = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    interpret(k, [sem, out], (7, 1, 1))
    assert int(sem) == 7 and int(out) == 7
    src = full_source(k)
    assert "atomicAdd(sem + 0" in src and "__threadfence();" in src
    compiles(k)


def cluster_sum_kernel(with_barriers=True):
    """Blocks of a cluster of 2: each puts a value in its shared memory, then every thread adds
    its partner block's value read through distributed shared memory."""
    rank = K.Special("cluster_rank")
    body = [K.Alloc("sm", F, (), "shared"), K.Alloc("v", F, ()),
            K.If(K.Bin("==", tx, C(0)), [K.Load("v", (), "x", bx, 1), K.Assign("sm", (), K.ArrayRef("v", ()))])]
    if with_barriers:
        body.append(K.ClusterSync())
    other = K.Bin("-", C(1), rank)
    body += [K.Assign("v", (), K.Op("add", (K.RemoteRef("sm", (), rank), K.RemoteRef("sm", (), other)), F))]
    if with_barriers:
        body.append(K.ClusterSync())
    body.append(K.If(K.Bin("==", tx, C(0)), [K.Store("out", bx, "v", (), 1)]))
    k = kernel("pf_test_cluster", body, (32, 1, 1), [("x", F, False), ("out", F, True)])
    k.cluster = 2
    return k


def test_cluster_distributed_shared_memory():
    k = cluster_sum_kernel()
    x = torch.arange(6, dtype=torch.float32)
    out = torch.full((6,), float("nan"))
    interpret(k, [x, out], (6, 1, 1))
    assert torch.equal(out, (x.view(3, 2).sum(1, keepdim=True)).expand(3, 2).reshape(6))
    src = full_source(k)
    assert "__cluster_dims__(2, 1, 1)" in src and "pf_dsmem_load(&sm, " in src
    compiles(k)


def test_remote_read_without_cluster_barrier_is_a_race():
    with pytest.raises(KernelRaceError, match="cluster barrier"):
        interpret(cluster_sum_kernel(with_barriers=False), [torch.randn(4), torch.empty(4)], (4, 1, 1))


def split_barrier_kernel(window=()):
    """Blocks of a cluster of 2, two rounds: thread 0 puts x[2 b + r] in its shared memory, a
    cluster barrier, every thread adds its partner block's value (distributed shared memory),
    then a split barrier: `ClusterSync("arrive")`, the statements of `window` ("write": thread 0
    rewrites its shared value; "read": every thread reads the partner's again), then
    `ClusterSync("wait")`."""
    rank = K.Special("cluster_rank")
    other = K.Bin("-", C(1), rank)
    body = [K.Alloc("sm", F, (), "shared"), K.Alloc("v", F, ()), K.Alloc("acc", F, ()),
            K.Assign("acc", (), K.Const(0.0, "float", F))]
    for r in range(2):
        body += [K.If(K.Bin("==", tx, C(0)), [K.Load("v", (), "x", K.add(K.mul(bx, C(2)), C(r)), 1),
                                               K.Assign("sm", (), K.ArrayRef("v", ()))]),
                 K.ClusterSync(),
                 K.Assign("acc", (), K.Op("add", (K.ArrayRef("acc", ()), K.RemoteRef("sm", (), other)), F))]
        body.append(K.ClusterSync("arrive"))
        if "write" in window:
            body.append(K.If(K.Bin("==", tx, C(0)), [K.Assign("sm", (), K.Const(0.0, "float", F))]))
        if "read" in window:
            body.append(K.Assign("v", (), K.RemoteRef("sm", (), other)))
        body.append(K.ClusterSync("wait"))
    body.append(K.If(K.Bin("==", tx, C(0)), [K.Store("out", bx, "acc", (), 1)]))
    k = kernel("pf_test_split_cluster", body, (32, 1, 1), [("x", F, False), ("out", F, True)])
    k.cluster = 2
    return k


def test_split_cluster_barrier_orders_what_came_before_its_arrive():
    """A remote read before the arrive, then the owner's rewrite after the wait: ordered (the
    combine of a cluster row, whose next row rewrites the partial after the wait)."""
    k = split_barrier_kernel()
    x = torch.arange(8, dtype=torch.float32)
    out = torch.full((4,), float("nan"))
    interpret(k, [x, out], (4, 1, 1))
    partner = torch.tensor([1, 0, 3, 2])
    assert torch.equal(out, x.view(4, 2).sum(1)[partner])
    src = full_source(k)
    assert src.count("pf_cluster_arrive();") == 2 and src.count("pf_cluster_wait();") == 2
    compiles(k)


@pytest.mark.parametrize("window,match", [
    ("write", "written by thread .* unordered"),          # a rewrite racing the partner's read
    ("read", "written by thread .* unordered")])          # a read racing the next round's write
def test_split_cluster_barrier_orders_nothing_between_its_halves(window, match):
    with pytest.raises(KernelRaceError, match=match):
        interpret(split_barrier_kernel(window=(window,)), [torch.randn(8), torch.empty(4)], (4, 1, 1))


@pytest.mark.parametrize("phases,match", [
    (["arrive", "arrive", "wait"], "an arrive is still to be waited for"),
    (["arrive", "sync", "wait"], "an arrive is still to be waited for"),
    (["wait"], "no arrive came before"),
    (["arrive"], "arrive is never waited for")])
def test_split_cluster_barrier_halves_alternate(phases, match):
    k = kernel("pf_test_split_order", [K.ClusterSync(p) for p in phases], (32, 1, 1),
               [("x", F, False)])
    k.cluster = 2
    with pytest.raises(KernelRaceError, match=match):
        interpret(k, [torch.randn(4)], (4, 1, 1))


def test_cluster_sync_phase_is_checked():
    with pytest.raises(ValueError, match="phase 'half'"):
        K.ClusterSync("half")
