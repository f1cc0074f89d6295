"""Shared pytest setup: tests marked `gpu` are skipped when no CUDA device is available."""
import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no usable torch means no GPU
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_fusion_cache():
    """Each test starts with an empty FusionCache (as a new process would): a definition repeated
    within a test is a cache hit, one repeated across tests is not shared."""
    from pyfuser.frontend.fusion_cache import FusionCache
    FusionCache.reset()
    yield
