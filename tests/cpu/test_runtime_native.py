"""The native cached-call runner (runtime/csrc/fast_runner.cpp) on its own, on CPU tensors, with
ctypes callbacks standing in for libcuda: keys and misses, allocations and views, what a launch
writes into its buffer, the context retry, failures, effects, argument checks and garbage
collection. (test_runtime_fastpath.py runs every fast-path test through it as well.)"""
import ctypes
import enum
import gc
import struct
import weakref

import pytest
import torch

from pyfuser.runtime import native

V = ctypes.c_void_p
CFG = struct.Struct("<7I4xQQI4x")


@pytest.fixture(scope="module")
def mod():
    m = native._load()
    assert m is not None, "the native runner did not build (see the log)"
    return m


class Driver:
    """Callbacks for configure(): each launch is decoded (config, then 8-byte parameters)."""

    def __init__(self, mod, nparams, codes=(), current=7):
        self.launches, self.calls, self.errors = [], [], []
        self.codes, self.current, self.nparams = list(codes), current, nparams

        def guard(f):
            def call(*args):
                try:
                    return f(*args)
                except BaseException as e:  # noqa: BLE001 - checked by the test
                    self.errors.append(e)
                    return 999
            return call
        cell = ctypes.CFUNCTYPE(ctypes.c_int, V)
        self.cbs = (ctypes.CFUNCTYPE(ctypes.c_int, V, V, V, V)(guard(self.launch)),
                    cell(guard(self.get_current)), cell(guard(self.push)), cell(guard(self.pop)))
        mod.configure(*[ctypes.cast(c, V).value for c in self.cbs], self.stream)

    def stream(self, device):
        self.calls.append(("stream", device))
        return 0xABC0 + device

    def launch(self, cfg, fn, params, extra):
        dims = CFG.unpack(ctypes.string_at(cfg, 56))
        ptrs = (V * self.nparams).from_address(params)
        vals = [ctypes.c_uint64.from_address(p).value for p in ptrs]
        self.launches.append((dims, fn, vals, [p - cfg for p in ptrs], extra))
        return self.codes.pop(0) if self.codes else 0

    def get_current(self, addr):
        V.from_address(addr).value = self.current
        self.calls.append(("get",))
        return 0

    def push(self, ctx):
        self.calls.append(("push", ctx))
        return 0

    def pop(self, addr):
        self.calls.append(("pop",))
        return 0


def _buffer(dims=(4, 1, 1, 128, 1, 1, 0), consts=(11, 22)):
    """A CUlaunchConfig then parameters: two pointers (to write) and two constants."""
    return CFG.pack(*dims, 0, 0, 0) + struct.pack("<QQQQ", 0, 0, *consts)


class Sink:
    runs = 0
    last = None


def _runner(mod, n=2, slow=None, env=None):
    slow = slow or (lambda inputs: ("slow", len(inputs)))
    return mod.Runner(n, slow, env, (b"PYFUSER_DUMP",))


def _launch_program(fail=None, consts=(11, 22)):
    steps = [("alloc", (6,), (1,), torch.empty(0, dtype=torch.float64)),
             ("launch", 0x1234, 7, _buffer(consts=consts), [56, 64, 72, 80], [(56, 0), (64, 2)],
              fail or (lambda code, call: (_ for _ in ()).throw(RuntimeError(f"{call}:{code}"))))]
    return steps


def test_hit_allocates_launches_and_applies_effects(mod):
    drv = Driver(mod, 4)
    r = _runner(mod)
    sink, report = Sink(), {}
    xs = [torch.randn(6), torch.randn(6)]
    r.add(xs, _launch_program(), [2], [("incr", sink, "runs"), ("setattr", sink, "last", "hit"),
                                       ("setitem", report, "k", "v")], 3)
    assert len(r) == 1 and r.key(xs) is not None
    ys = [torch.randn(6), torch.randn(6)]
    (out,) = r.run(ys)
    assert (out.shape, out.stride(), out.dtype) == ((6,), (1,), torch.float64)
    dims, fn, vals, offsets, extra = drv.launches[-1]
    assert dims[:7] == (4, 1, 1, 128, 1, 1, 0) and dims[7] == 0xABC0 + 3     # the stream
    assert fn == 0x1234 and extra is None and offsets == [56, 64, 72, 80]
    assert vals == [ys[0].data_ptr(), out.data_ptr(), 11, 22]
    assert (sink.runs, sink.last, report) == (1, "hit", {"k": "v"})
    (out2,) = r.run(tuple(ys))                                    # a tuple, fresh output
    assert out2.data_ptr() != out.data_ptr()
    assert sink.runs == 2 and ("stream", 3) in drv.calls and not drv.errors


def test_misses_call_slow(mod):
    Driver(mod, 4)
    seen = []
    r = _runner(mod, slow=lambda inputs: seen.append(inputs) or "slow")
    xs = [torch.randn(6), torch.randn(6)]
    r.add(xs, _launch_program(), [2], [], 0)
    base = torch.randn(13)
    for other in ([torch.randn(7), torch.randn(6)],                     # size
                  [torch.randn(12)[::2], torch.randn(6)],               # stride
                  [base[1:7], torch.randn(6)],                          # alignment
                  [torch.randn(6, dtype=torch.float64), torch.randn(6)],  # dtype
                  [torch.randn(6)],                                     # count
                  [torch.randn(6), 1.0],                                # not a tensor
                  [torch.randn(6), torch.randn(6).to_sparse()],         # layout
                  iter(xs)):                                            # not a list
        assert r.run(other) == "slow"
    assert len(seen) == 8 and r.key([torch.randn(6)]) is None


def test_environment_sends_to_slow(mod):
    Driver(mod, 4)
    env = {}
    r = _runner(mod, slow=lambda inputs: "slow", env=env)
    xs = [torch.randn(6), torch.randn(6)]
    r.add(xs, _launch_program(), [2], [], 0)
    assert isinstance(r.run(xs), list)
    env[b"PYFUSER_DUMP"] = b"cuda_kernel"
    assert r.run(xs) == "slow"


def test_views_and_inputs_as_results(mod):
    r = _runner(mod, n=1)
    x = torch.randn(4, 6)
    steps = [("view", 0, (6, 4), (1, 6)),
             ("alloc", (2, 3), (1, 2), torch.empty(0, dtype=torch.int32))]
    r.add([x], steps, [1, 0, 2], [], -1)
    y = torch.randn(4, 6)
    view, same, new = r.run([y])
    assert same is y and view._base is y and view.stride() == (1, 6) and torch.equal(view, y.t())
    assert (new.shape, new.stride(), new.dtype) == ((2, 3), (1, 2), torch.int32)


def test_refused_launch_retried_in_its_context(mod):
    drv = Driver(mod, 4, codes=[201], current=5)           # another context is current
    r = _runner(mod)
    xs = [torch.randn(6), torch.randn(6)]
    r.add(xs, _launch_program(), [2], [], 0)
    (out,) = r.run(xs)
    assert len(drv.launches) == 2 and drv.launches[1][2][1] == out.data_ptr()
    assert [c for c in drv.calls if c[0] != "stream"] == [("get",), ("push", 7), ("pop",)]


def test_failed_launch_raises_through_fail(mod):
    Driver(mod, 4, codes=[700, 700], current=7)            # our context is current: no retry
    seen = []

    def fail(code, call):
        seen.append((code, call))
        raise RuntimeError("launch failed")
    r = _runner(mod)
    sink = Sink()
    xs = [torch.randn(6), torch.randn(6)]
    r.add(xs, _launch_program(fail), [2], [("incr", sink, "runs")], 0)
    with pytest.raises(RuntimeError, match="launch failed"):
        r.run(xs)
    assert seen == [(700, "launch")] and sink.runs == 0    # no effects after a failure


def test_add_checks_its_arguments(mod):
    Driver(mod, 4)
    r = _runner(mod)
    xs = [torch.randn(6), torch.randn(6)]
    with pytest.raises(ValueError, match="slot 5"):
        r.add(xs, [("view", 5, (1,), (1,))], [], [], 0)
    with pytest.raises(ValueError, match="result slot 2"):
        r.add(xs, [], [2], [], 0)
    with pytest.raises(ValueError, match="outside"):
        r.add(xs, [("launch", 1, 7, _buffer(), [56, 4000], [], lambda c, s: None)], [], [], 0)
    with pytest.raises(ValueError, match="unknown step"):
        r.add(xs, [("copy", 0)], [], [], 0)
    with pytest.raises(ValueError, match="strided tensors"):
        r.add([xs[0]], [], [], [], 0)
    with pytest.raises(ValueError, match="unknown effect"):
        r.add(xs, [], [], [("poke", xs, "a")], 0)
    fail = lambda c, s: None                                  # noqa: E731
    with pytest.raises(ValueError, match="rng write"):
        r.add(xs, [("launch", 1, 7, _buffer(), [56], [], fail, lambda: (1, 2, 3), [(4000, 0)])],
              [], [], 0)
    with pytest.raises(ValueError, match="rng write"):
        r.add(xs, [("launch", 1, 7, _buffer(), [56], [], fail, lambda: (1, 2, 3), [(72, 3)])],
              [], [], 0)
    with pytest.raises(TypeError, match="draw must be callable"):
        r.add(xs, [("launch", 1, 7, _buffer(), [56], [], fail, 3, [])], [], [], 0)
    with pytest.raises(TypeError, match="a tensor"):
        r.add(xs, [("const", 3, 0)], [], [], 0)
    with pytest.raises(ValueError, match="different streams"):
        r.add(xs, [("const", xs[0], 1), ("const", xs[1], 2)], [], [], 0)
    assert len(r) == 0


def test_clear_and_garbage_collection(mod):
    r = _runner(mod, n=1)
    x = torch.randn(3)

    class Holder:
        pass
    h = Holder()
    h.runner = r                                           # a cycle through the runner
    r.add([x], [], [0], [("setattr", h, "last", 1)], -1)
    assert r.run([x])[0] is x and h.last == 1
    r.clear()
    assert len(r) == 0 and r.run([x]) == ("slow", 1)
    r.add([x], [], [0], [("setattr", h, "last", 2)], -1)
    ref = weakref.ref(h)
    del h, r
    gc.collect()
    assert ref() is None


def test_a_failed_build_warns_and_gives_none(tmp_path, caplog):
    src = tmp_path / "broken.cpp"
    src.write_text("int ok() { return 0; }\nint broken( {\n")
    with caplog.at_level("WARNING", logger="pyfuser"):
        assert native.build_or_import(str(tmp_path / "pyfuser_native_broken"), str(src)) is None
    text = caplog.text
    assert "building the native cached-call runner" in text
    assert "native runner is unavailable" in text and "broken.cpp:2" in text.split("unavailable")[1]


def _tiny_source(tmp_path, name):
    src = tmp_path / "tiny.cpp"
    src.write_text(                              # plain CPython: builds in about a second
        "#include <Python.h>\n"
        "static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(42); }\n"
        "static PyMethodDef M[] = {{\"answer\", answer, METH_NOARGS, nullptr}, {}};\n"
        f"static PyModuleDef D = {{PyModuleDef_HEAD_INIT, \"{name}\", nullptr, -1, M}};\n"
        f"PyMODINIT_FUNC PyInit_{name}() {{ return PyModule_Create(&D); }}\n")
    return src


def test_a_damaged_build_is_rebuilt(tmp_path):
    d = tmp_path / "pyfuser_native_damaged"
    d.mkdir()
    (d / "pyfuser_native_damaged.so").write_bytes(b"not an ELF file")
    m = native.build_or_import(str(d), str(_tiny_source(tmp_path, "pyfuser_native_damaged")))
    assert m is not None and m.answer() == 42


def test_processes_building_at_once_all_load_the_build(tmp_path):
    """Several processes (test shards, DDP ranks running `make setup`) asking for the same build
    at once: one builds, the others wait for it; none reads a half-linked .so or removes one."""
    import subprocess
    import sys
    d = tmp_path / "pyfuser_native_shared"
    src = _tiny_source(tmp_path, "pyfuser_native_shared")
    code = ("import sys; from pyfuser.runtime import native; "
            "m = native.build_or_import(sys.argv[1], sys.argv[2]); "
            "print('answer', m.answer() if m is not None else None)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(d), str(src)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all("answer 42" in o for o in outs), outs


def test_a_build_in_progress_is_left_alone(tmp_path):
    """While one process holds the build's lock (it is linking the .so), another waits: it
    neither loads the half-written file nor removes it as damaged."""
    import fcntl
    import subprocess
    import sys
    import time
    d = tmp_path / "pyfuser_native_busy"
    d.mkdir()
    so = d / "pyfuser_native_busy.so"
    src = _tiny_source(tmp_path, "pyfuser_native_busy")
    code = ("import sys, torch; from pyfuser.runtime import native; "
            "print('started', flush=True); "
            "m = native.build_or_import(sys.argv[1], sys.argv[2]); "
            "print('answer', m.answer() if m is not None else None)")
    with open(str(d) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        so.write_bytes(b"half a linked file")
        p = subprocess.Popen([sys.executable, "-c", code, str(d), str(src)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.stdout.readline().strip() == "started"
        time.sleep(1.0)
        assert p.poll() is None and so.read_bytes() == b"half a linked file"
    out = p.communicate(timeout=300)[0]               # the lock is free: it rebuilds and loads
    assert "answer 42" in out, out


def test_torch_errors_keep_their_type_and_skip_effects(mod):
    r = _runner(mod, n=1)
    sink = Sink()
    x = torch.randn(3)
    r.add([x], [("alloc", (-2,), (1,), torch.empty(0))], [1], [("incr", sink, "runs")], -1)
    with pytest.raises(RuntimeError, match="negative dimension"):
        r.run([x])
    assert sink.runs == 0


def test_a_program_dropped_during_its_replay_finishes(mod):
    """Python code run by a replay (here an effect) may clear the runner: the replay still ends
    on the program it started (the runner holds programs by shared reference)."""
    r = _runner(mod, n=1)
    x = torch.randn(3)

    class Clearing:
        def __setattr__(self, name, value):
            r.clear()
            object.__setattr__(self, name, value)
    c = Clearing()
    r.add([x], [("alloc", (3,), (1,), torch.empty(0))], [1, 0],
          [("setattr", c, "a", 1), ("setattr", c, "b", 2)], -1)
    out, same = r.run([x])
    assert same is x and out.shape == (3,) and (c.a, c.b) == (1, 2) and len(r) == 0


def test_random_launches_draw_before_writing(mod):
    """A launch with `draw` gets a fresh (seed, offset, state) per replay written at its rng
    offsets (each launch writes the values it takes);
    the program's draws are all made, in launch order, before any launch (no Python code runs
    between buffer writes); the seed keeps its bit pattern (a negative int64)."""
    drv = Driver(mod, 4)
    r = _runner(mod)
    draws, order = iter([(-5, 8, 100), (7, 12, 200), (-9, 16, 300), (11, 20, 400)]), []

    def draw(name):
        def f():
            order.append((name, len(drv.launches)))
            return next(draws)
        return f
    fail = lambda c, s: None                                   # noqa: E731
    steps = [("alloc", (6,), (1,), torch.empty(0, dtype=torch.float64)),
             ("launch", 0x1234, 7, _buffer(), [56, 64, 72, 80], [(56, 0), (64, 2)], fail,
              draw("a"), [(72, 0), (80, 1)]),
             ("launch", 0x5678, 7, _buffer(), [56, 64, 72, 80], [(56, 2), (64, 1)], fail,
              draw("b"), [(80, 0), (72, 2)])]
    xs = [torch.randn(6), torch.randn(6)]
    r.add(xs, steps, [2], [], 0)
    (out,) = r.run(xs)
    assert order == [("a", 0), ("b", 0)]                       # both drawn before launching
    (_, fn_a, vals_a, _, _), (_, fn_b, vals_b, _, _) = drv.launches
    assert (fn_a, fn_b) == (0x1234, 0x5678)
    assert vals_a == [xs[0].data_ptr(), out.data_ptr(), (-5) % 2 ** 64, 8]
    assert vals_b == [out.data_ptr(), xs[1].data_ptr(), 200, 7]
    r.run(xs)                                                  # a new state every replay
    assert drv.launches[2][2][2:] == [(-9) % 2 ** 64, 16] and drv.launches[3][2][2:] == [400, 11]
    draws = iter([("bad",)])
    with pytest.raises(TypeError, match="seed, offset, state"):
        r.run(xs)
    assert len(drv.launches) == 4                              # a failed draw launches nothing


def test_const_slots_are_pinned_to_their_stream(mod):
    """A const step's tensor is the slot itself (a grid reduction's semaphores); it belongs to the
    stream it was recorded on, so a replay on another stream is a miss."""
    drv = Driver(mod, 4)
    r = _runner(mod, slow=lambda inputs: "slow")
    sem = torch.zeros(4, dtype=torch.int32)
    fail = lambda c, s: None                                   # noqa: E731
    steps = [("const", sem, 0xABC0 + 3),
             ("launch", 0x1234, 7, _buffer(), [56, 64, 72, 80], [(56, 0), (64, 2)], fail)]
    xs = [torch.randn(6), torch.randn(6)]
    r.add(xs, steps, [2, 0], [], 3)
    same, x0 = r.run(xs)
    assert same is sem and x0 is xs[0]
    assert drv.launches[-1][2][:2] == [xs[0].data_ptr(), sem.data_ptr()]
    r2 = _runner(mod, slow=lambda inputs: "slow")
    r2.add(xs, [("const", sem, 0xABC0 + 4)] + steps[1:], [2], [], 3)   # recorded elsewhere
    assert r2.run(xs) == "slow" and len(drv.launches) == 1


class _Three(enum.IntEnum):
    THREE = 3


class _F(float):
    pass


def test_graph_key_tells_apart_what_the_python_key_does(mod):
    """graph_key (GraphedInference.key's C++ pass): two argument lists get equal keys exactly
    when the Python key's tuples are equal (dtype, sizes, strides, storage offset, a keyed
    input's address; scalars by type and value); what it does not take gives None."""
    from pyfuser.frontend.fx.cuda_graphs import GraphedInference

    class AnyDevice:
        any_device = True
    g = GraphedInference(lambda args: args, static_idx=(1,), backend=AnyDevice())
    g.keyed_by_address = True
    base = torch.randn(4, 6)
    w = torch.randn(6)
    variants = [
        [base, w, 3, 1.5, None, True],
        [base.clone(), w, 3, 1.5, None, True],           # another address, not keyed: same
        [base, w.clone(), 3, 1.5, None, True],           # the keyed input moved
        [base.t(), w, 3, 1.5, None, True],               # strides / sizes
        [base[1:], w, 3, 1.5, None, True],               # sizes, storage offset
        [base.double(), w, 3, 1.5, None, True],          # dtype
        [base, w, 4, 1.5, None, True],
        [base, w, 3.0, 1.5, None, True],                 # an int and a float of one value
        [base, w, 3, 1.5, None, 1],                      # a bool and an int
        [base, w, 3, -0.0, None, True], [base, w, 3, 0.0, None, True],
        [base, w, 3, 1.5, None],                         # fewer arguments
        [base, w, _Three.THREE, 1.5, None, True],        # an int subclass: its own type
        [base, w, 3, _F(1.5), None, True],               # a float subclass
        [base, w, 3, _F(-0.0), None, True], [base, w, 3, _F(0.0), None, True],
    ]
    mask = bytes([0, 1, 0, 0, 0, 0])
    nat = [mod.graph_key(v, mask[:len(v)], True) for v in variants]
    py = [g.python_key(v) for v in variants]
    assert all(isinstance(k, bytes) for k in nat)
    for i in range(len(variants)):
        for j in range(len(variants)):
            assert (nat[i] == nat[j]) == (py[i] == py[j]), (i, j)
    assert nat[0] == nat[1] and nat[0] != nat[2]
    assert mod.graph_key([base, w], bytes(2), False) is None          # a CPU tensor, no any_device
    assert mod.graph_key([base, object()], bytes(2), True) is None
    assert mod.graph_key([base, 2 ** 70], bytes(2), True) is None
    assert mod.graph_key([base.to_sparse()], bytes(1), True) is None
    assert g.key([base, w, 2 ** 70]) is None and g.python_key([base, w, 2 ** 70]) is not None


def test_use_counts_and_hand_out(mod):
    """use_counts gives torch's own storage use counts (views and new tensors on a storage raise
    them); hand_out builds tensors on given storages with the given layout."""
    from pyfuser.frontend.fx.cuda_graph_outputs import use_count
    a, b = torch.randn(12), torch.randn(3)
    sa, sb = a.untyped_storage(), b.untyped_storage()
    before = mod.use_counts([sa, sb])
    assert before == (use_count(sa), use_count(sb))
    made = mod.hand_out([(sa, torch.float32, (2, 3), (1, 2), 4), (sb, torch.float32, (3,), (1,), 0)])
    assert torch.equal(made[0], a.as_strided((2, 3), (1, 2), 4)) and torch.equal(made[1], b)
    assert made[0].untyped_storage().data_ptr() == sa.data_ptr()
    assert mod.use_counts([sa, sb]) == (before[0] + 1, before[1] + 1) == (use_count(sa),
                                                                         use_count(sb))
    del made
    assert mod.use_counts([sa, sb]) == before
    with pytest.raises(TypeError, match="storages"):
        mod.use_counts([a])
    with pytest.raises(TypeError, match="items are"):
        mod.hand_out([(a, torch.float32, (1,), (1,), 0)])
    with pytest.raises(TypeError, match="lists or tuples of ints"):
        mod.hand_out([(sa, torch.float32, 3, (1,), 0)])


def test_hand_out_tensors_behave_as_set_ones(mod):
    """hand_out makes each tensor directly on its storage: the same layout, dtype, device and
    storage as `torch.empty(0).set_(...)`, usable by autograd (requires_grad, a backward) and in
    inference mode, empty views of any offset; a view reaching past its storage, a negative
    offset or sizes and strides of different lengths are refused (ValueError), never made."""
    base = torch.arange(24, dtype=torch.bfloat16)
    st = base.untyped_storage()
    items = [(st, torch.bfloat16, (3, 4), (8, 2), 1), (st, torch.bfloat16, (0, 5), (5, 1), 24),
             (st, torch.bfloat16, (), (), 23), (st, torch.int16, (2,), (12,), 0)]
    for (s, dt, size, stride, off), t in zip(items, mod.hand_out(items)):
        want = torch.empty(0, dtype=dt).set_(s, off, size, stride)
        assert (t.shape, t.stride(), t.storage_offset(), t.dtype, t.device) == \
            (want.shape, want.stride(), want.storage_offset(), want.dtype, want.device)
        assert t.untyped_storage().data_ptr() == st.data_ptr() and torch.equal(t, want)
        assert not t.requires_grad and t.grad_fn is None
    f = mod.hand_out([(torch.randn(6).untyped_storage(), torch.float32, (2, 3), (3, 1), 0)])[0]
    f.requires_grad_(True)
    (f * f).sum().backward()
    assert torch.equal(f.grad, 2 * f.detach())
    with torch.inference_mode():
        g = mod.hand_out([(st, torch.bfloat16, (4,), (1,), 0)])[0]
        assert g.is_inference() and torch.equal(g, base[:4])
    for bad in [(st, torch.bfloat16, (3, 4), (8, 2), 2), (st, torch.float32, (13,), (1,), 0),
                (st, torch.bfloat16, (2,), (1,), -1), (st, torch.bfloat16, (2, 2), (1,), 0)]:
        with pytest.raises(ValueError, match="past its storage"):
            mod.hand_out([bad])
