"""tools/profile_models.py's pure helpers (the tool itself needs a GPU for its numbers)."""
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
