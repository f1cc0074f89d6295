"""pyfuser: a fusion compiler for PyTorch (TorchScript IR / FusionDefinition in, CUDA kernels out).

`from pyfuser import Fusion, FusionDefinition, DataType` gives nvFuser's Python frontend. The
names load lazily, so `import pyfuser` stays cheap (no torch import until they are used).
"""
__version__ = "0.1.0"

_LAZY = {
    "Fusion": ("pyfuser.frontend.definition", "Fusion"),
    "FusionDefinition": ("pyfuser.frontend.definition", "FusionDefinition"),
    "DataType": ("pyfuser.ir.dtypes", "DataType"),
    "jit": ("pyfuser.frontend.torchscript.fuse_api", "jit"),
    "fuse_graph": ("pyfuser.frontend.torchscript.fuse_api", "fuse_graph"),
}
__all__ = ["Fusion", "FusionDefinition", "DataType", "jit", "fuse_graph", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pyfuser' has no attribute {name!r}")
