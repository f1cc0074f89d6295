"""NVRTC compilation (no GPU needed): CUBIN for the exact arch, options, errors with the log,
the cuda_to_file dump, and the disk cache in front of the compiler."""
import pytest

pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (NVRTC) is not installed")

from pyfuser.errors import CompileError  # noqa: E402
from pyfuser.runtime import disk_cache, nvrtc  # noqa: E402

ADD = r'''
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void pf_test_add(const float* a, const float* b, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
'''


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYFUSER_DISABLE_DISK_CACHE", raising=False)
    monkeypatch.delenv("PYFUSER_ARCH", raising=False)


def test_compile_produces_cubin_for_the_exact_arch():
    b = nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90")
    assert b.cubin[:4] == b"\x7fELF"
    assert b.lowered_name == "pf_test_add" and b.arch == "sm_90"
    assert b.compile_time_s > 0 and not b.from_disk


def test_default_arch_without_gpu_is_sm90(monkeypatch):
    import torch
    if not torch.cuda.is_available():
        assert nvrtc.default_arch() == "sm_90"
    monkeypatch.setenv("PYFUSER_ARCH", "80")
    assert nvrtc.default_arch() == "sm_80"


def test_options_are_precise_and_cxx17():
    opts = nvrtc.build_options("sm_90", ())
    assert opts[0] == "-arch=sm_90" and "--std=c++17" in opts and "-default-device" in opts
    assert not any("fast" in o for o in opts)
    with pytest.raises(CompileError, match="fast-math"):
        nvrtc.build_options("sm_90", ("-use_fast_math",))


def test_minimal_front_end_where_nvrtc_has_it_and_the_same_cubin():
    """-minimal (NVRTC 12.4+) leaves out declarations no generated kernel uses: a kernel using
    the prelude's half and bfloat16 helpers compiles to the same CUBIN with and without it."""
    pytest.importorskip("cuda.bindings.nvrtc")
    if nvrtc.nvrtc_version() < nvrtc.MINIMAL_SINCE:
        assert "-minimal" not in nvrtc.build_options("sm_90", ())
        pytest.skip("NVRTC before 12.4 has no -minimal")
    opts = nvrtc.build_options("sm_90", ())
    assert "-minimal" in opts
    from pyfuser.codegen.prelude import PRELUDE
    src = PRELUDE + ('extern "C" __global__ void lean_probe(const pf_bf16* a, pf_half* b, int n)'
                     ' {\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
                     '  if (i < n) b[i] = pf_to_storage<pf_half>(expf(pf_to_reg(a[i])));\n}\n')
    without = tuple(o for o in opts if o != "-minimal")
    lean = nvrtc._compile(src, "lean_probe", "sm_90", opts, "lean")
    full = nvrtc._compile(src, "lean_probe", "sm_90", without, "full")
    assert lean.cubin == full.cubin and len(lean.cubin) > 0


def test_cuda_headers_are_found():
    assert any(o.startswith("-I") for o in nvrtc.include_options()), \
        "cuda_fp16.h not found: set PYFUSER_CUDA_INCLUDE"


def test_cxx_mangled_kernel_name_is_resolved():
    src = "__global__ void pf_mangled(float* a, int n) { if (threadIdx.x < n) a[threadIdx.x] = 1.f; }"
    b = nvrtc.compile_cuda(src, "pf_mangled", arch="sm_90")
    assert b.lowered_name.startswith("_Z") and "pf_mangled" in b.lowered_name


def test_compile_error_has_name_and_log(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_DUMP", "cuda_to_file")
    monkeypatch.setenv("PYFUSER_DUMP_DIR", str(tmp_path / "dump"))
    bad = 'extern "C" __global__ void pf_bad(float* a) { a[0] = undefined_thing; }'
    with pytest.raises(CompileError) as ei:
        nvrtc.compile_cuda(bad, "pf_bad", arch="sm_90")
    msg = str(ei.value)
    assert "pf_bad" in msg and "undefined_thing" in msg and "error" in msg
    assert (tmp_path / "dump" / "pf_bad.cu").read_text() == bad
    assert str(tmp_path / "dump" / "pf_bad.cu") in msg


def test_missing_kernel_name_is_a_compile_error():
    with pytest.raises(CompileError, match="pf_nope"):
        nvrtc.compile_cuda(ADD, "pf_nope", arch="sm_90")


def test_disk_cache_in_front_of_nvrtc(monkeypatch):
    a = nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90")
    b = nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90")
    assert not a.from_disk and b.from_disk and b.cubin == a.cubin and b.key == a.key
    assert b.lowered_name == a.lowered_name and b.compile_time_s == 0.0
    # another arch or option is another entry
    c = nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_80")
    d = nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90", options=("-lineinfo",))
    assert len({a.key, c.key, d.key}) == 3 and not c.from_disk and not d.from_disk
    # a damaged entry is recompiled and rewritten, never a crash
    with open(disk_cache.entry_path(a.key), "r+b") as f:
        f.seek(100)
        f.write(b"garbage!")
    e = nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90")
    assert not e.from_disk and e.cubin == a.cubin
    assert nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90").from_disk
    # bypass
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    assert not nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90").from_disk


SUB = ADD.replace("pf_test_add", "pf_test_sub").replace("a[i] + b[i]", "a[i] - b[i]")


def test_forged_entry_for_a_kernel_is_recompiled():
    """An entry holding another kernel's CUBIN under this kernel's key (checksum valid) is
    rejected: the entry must carry this key and this kernel's name."""
    good = nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90")
    other = nvrtc.compile_cuda(SUB, "pf_test_sub", arch="sm_90")
    with open(disk_cache.entry_path(good.key), "wb") as f:
        f.write(disk_cache.encode(other.lowered_name.encode() + b"\0" + other.cubin,
                                  good.key, "pf_test_sub"))
    again = nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90")
    assert not again.from_disk and again.cubin == good.cubin
    with open(disk_cache.entry_path(good.key), "wb") as f:     # a copy of the other's entry
        with open(disk_cache.entry_path(other.key), "rb") as g:
            f.write(g.read())
    again = nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90")
    assert not again.from_disk and again.cubin == good.cubin
    assert nvrtc.compile_cuda(ADD, "pf_test_add", arch="sm_90").from_disk


def test_nvrtc_version_is_kept_in_the_disk_cache(monkeypatch, tmp_path):
    """A process whose kernels come from the disk cache does not load NVRTC to learn its
    version: it is kept under the identity of the wheel's libnvrtc."""
    from pyfuser.runtime import nvrtc
    if nvrtc._library_identity() is None:
        pytest.skip("NVRTC is not a pip wheel here")
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PYFUSER_DISABLE_DISK_CACHE", raising=False)
    want = nvrtc.nvrtc_version.__wrapped__()             # loads NVRTC, stores the answer
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: (_ for _ in ()).throw(AssertionError("loaded")))
    assert nvrtc.nvrtc_version.__wrapped__() == want
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    with pytest.raises(AssertionError, match="loaded"):
        nvrtc.nvrtc_version.__wrapped__()
