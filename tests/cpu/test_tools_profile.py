"""tools/profile_models.py's pure helpers (the tool itself needs a GPU for its numbers), and every lazy
import of the tools and benchmarks resolving (they run only on a GPU machine, so a moved name
would fail there first)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

import profile_models as P  # noqa: E402


def test_gpu_gaps_merges_overlapping_kernels_and_ranks_the_idle_stretches():
    iv = [(20, 30, "c"), (0, 10, "a"), (5, 12, "b"), (31, 40, "d"), (100, 101, "e")]
    span, busy, gaps = P.gpu_gaps(iv, 2)
    assert span == 101 and busy == 12 + 10 + 9 + 1
    assert gaps == [(60, "d", "e"), (8, "b", "c")]
    assert P.gpu_gaps([], 3) == (0.0, 0.0, [])


def _imports_from_project(path):
    """(module, name) of every `from bench... / pyfuser... import name` in a file, also inside
    functions (the tools import lazily, so a moved name fails only when the tool runs)."""
    import ast
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in ("bench", "pyfuser"):
            for alias in node.names:
                yield node.module, alias.name


def test_every_lazy_import_of_the_tools_names_something_that_exists():
    """tools/profile_compile.py imported `_sync` from bench.models after it had moved to
    bench/models_timing.py: the tool failed at its first run. Every such import must resolve."""
    import importlib
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    sys.path.insert(0, os.path.abspath(root))
    missing = []
    checked = 0
    for folder in ("tools", "bench"):
        for fname in sorted(os.listdir(os.path.join(root, folder))):
            if not fname.endswith(".py"):
                continue
            for module, name in _imports_from_project(os.path.join(root, folder, fname)):
                mod = importlib.import_module(module)
                checked += 1
                if name != "*" and not hasattr(mod, name):
                    try:
                        importlib.import_module(f"{module}.{name}")
                    except ImportError:
                        missing.append(f"{folder}/{fname}: from {module} import {name}")
    assert checked > 10 and not missing, missing


def test_phase_timers_count_exclusive_time_and_main_only_skips_other_threads():
    """tools/profile_compile.py's PhaseTimer (wall clock, every thread) and profile_warm.py's
    CpuPhases (the same timer on the main thread's CPU clock): a wrapped call's time goes to its
    innermost phase; CpuPhases leaves other threads' calls uncounted."""
    import threading
    import types
    import profile_compile
    import profile_warm
    for timer, threads_counted in ((profile_compile.PhaseTimer(), True),
                                   (profile_warm.CpuPhases(), False)):
        m = types.SimpleNamespace()
        m.inner = lambda: sum(i for i in range(200000))
        m.outer = lambda: (m.inner(), sum(i * i for i in range(200000)))
        timer.wrap(m, "outer", "out")
        timer.wrap(m, "inner", "in")
        timer.wrap(m, "inner", "again")          # wrapped once only
        m.outer()
        th = threading.Thread(target=m.inner)
        th.start()
        th.join()
        assert timer.counts == {"in": 2 if threads_counted else 1, "out": 1}
        assert timer.totals["out"] > 0 and timer.totals["in"] > 0
