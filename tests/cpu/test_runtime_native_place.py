"""Where the native cached-call runner's build lives: an install artifact whose place does not
follow the kernel cache (a process whose PYFUSER_CACHE_DIR differed from the install's found no
build and ran the Python replay)."""
import os

from pyfuser.runtime import native


def test_build_is_found_whatever_the_kernel_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("PYFUSER_NATIVE_DIR", raising=False)
    assert native.build() is not None                # the install step (a no-op once built)
    where = native.build_dir()
    assert os.path.exists(native._so(where))
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "fresh_cache"))
    assert native.build_dir() == where
    assert native.built()
    monkeypatch.setenv("PYFUSER_NATIVE", "1")
    assert native.runner_module() is not None


def test_native_dir_override_and_fallback_order(monkeypatch, tmp_path):
    monkeypatch.setenv("PYFUSER_NATIVE_DIR", str(tmp_path / "nat"))
    assert native.build_dir() == os.path.join(str(tmp_path / "nat"), native._name())
    monkeypatch.delenv("PYFUSER_NATIVE_DIR")
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    assert str(tmp_path / "cache" / "native") in native._places()   # older builds still found
    # a build only under the kernel cache (the old place) is the one used
    old = tmp_path / "cache" / "native" / native._name()
    old.mkdir(parents=True)
    monkeypatch.setattr(native, "_places", lambda: [str(tmp_path / "none"),
                                                    str(tmp_path / "cache" / "native")])
    assert native.build_dir() == str(tmp_path / "none" / native._name())
    (old / (native._name() + ".so")).write_bytes(b"")
    assert native.build_dir() == str(old)


def test_unwritable_package_dir_goes_last(monkeypatch, tmp_path):
    monkeypatch.delenv("PYFUSER_NATIVE_DIR", raising=False)
    monkeypatch.setattr(native, "_writable", lambda d: False)
    places = native._places()
    assert places[-1].endswith(os.path.join("runtime", "_native"))
