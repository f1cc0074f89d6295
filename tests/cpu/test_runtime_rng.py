"""runtime/rng.py: the seed, offset and device words of a random kernel's launch (the native
runner's drawer, CUDA-graph captures, what the kernel draws from them)."""
import pytest
import torch

from pyfuser.runtime import dispatch
from test_runtime_fastpath import _dropout_fusion  # tests/cpu is on the path


def test_a_cuda_drawer_reads_the_devices_generator_each_draw_and_yields_to_fixed(monkeypatch):
    """rng.drawer (the native runner's `draw`) looks the device's generator up once and then
    takes, per draw, its current seed and offset and advances the offset, as launch_state does:
    a manual_seed between draws is seen; inside rng.fixed the fixed stream is drawn instead."""
    from pyfuser.runtime import rng

    class Gen:                                 # torch.cuda's default generator, as far as used
        def __init__(self):
            self.seed, self.offset = 7, 0

        def get_offset(self):
            return self.offset

        def set_offset(self, v):
            self.offset = v

        def initial_seed(self):
            return self.seed
    gen = Gen()
    monkeypatch.setattr(torch.cuda, "default_generators", (Gen(), gen))
    zeros = torch.zeros(2, dtype=torch.int64)
    monkeypatch.setattr(rng, "zero_state", lambda device: zeros)
    z = zeros.data_ptr()
    draw = rng.drawer(torch.device("cuda", 1), 8)
    assert [draw() for _ in range(3)] == [(7, 0, z), (7, 8, z), (7, 16, z)]
    gen.seed, gen.offset = 2 ** 64 - 1, 4                  # a manual_seed: its state, not it
    assert draw() == (-1, 4, z) == (rng.launch_state("cuda:1", 8)[0], 4, z)
    assert gen.offset == 20
    with rng.fixed(99, 3):
        assert [draw(), draw()] == [(99, 3, z), (99, 11, z)]
    assert gen.offset == 20
    # inside a CUDA-graph capture of that device: seed 0, the capture's own running offsets
    # and device words (made by the first draw), the generator untouched
    monkeypatch.setattr(torch, "randint", lambda lo, hi, size, dtype, device: torch.tensor(
        [5, 6], dtype=dtype))
    with rng.capturing(torch.device("cuda", 1)) as cap:
        got = [draw(), draw()]
        assert got == [(0, 0, cap.state.data_ptr()), (0, 8, cap.state.data_ptr())]
        assert cap.state.tolist() == [5, 6]
        with pytest.raises(rng.HostDrawInCapture):
            rng.host_draw("cuda:1", 4)
        assert rng.host_draw("cuda:0", 4) == (7, 0)       # another device: not captured
    assert gen.offset == 20 and draw() == (-1, 20, z)
    # a capture not ours (the generator refuses a draw): the first draw raises before the zero
    # words are made, so they never land in that graph's memory
    made = []
    monkeypatch.setattr(rng, "zero_state", lambda device: made.append(device) or zeros)
    busy = Gen()

    def refuse(v):
        raise RuntimeError("Cannot call CUDAGeneratorImpl::set_offset")
    busy.set_offset = refuse
    monkeypatch.setattr(torch.cuda, "default_generators", (busy,))
    first = rng.drawer(torch.device("cuda", 0), 4)
    with pytest.raises(RuntimeError, match="set_offset"):
        first()
    assert made == []


def test_random_kernels_add_the_device_words_to_seed_and_offset():
    """A random kernel draws from (seed ^ state[0], offset + state[1]) (runtime/rng.py): inside a
    capture whose words are (s, o) its bits are those of host seed s at offset o, and outside
    one (zero words) the host draw's alone; its CUDA source reads the words."""
    from pyfuser.runtime import rng
    f = _dropout_fusion()
    x = torch.randn(3000)
    with rng.capturing("cpu") as cap:
        cap.state = torch.tensor([0x1234_5678_9ABC, 40], dtype=torch.int64)
        got = dispatch.execute_fusion(f, [x])[0]
    with rng.fixed(0x1234_5678_9ABC, 40):
        want = dispatch.execute_fusion(f, [x])[0]
    with rng.fixed(0x1234_5678_9ABC, 44):
        other = dispatch.execute_fusion(f, [x])[0]
    assert torch.equal(got, want) and not torch.equal(got, other)
    from pyfuser.codegen import api
    src = api.plan_kernel(f, [x]).kernel.source
    assert "pf_rng[0]" in src and "pf_rng[1]" in src and "const int64_t* __restrict__ pf_rng" in src
