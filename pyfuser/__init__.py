"""pyfuser: a fusion compiler for PyTorch (torch.compile graphs, TorchScript IR, FusionDefinition
in; CUDA kernels out).

`torch.compile(model, backend="pyfuser")` (or `pyfuser.compile(model)`) fuses the aten graphs of
forward and backward passes (pyfuser.frontend.fx).

`from pyfuser import Fusion, FusionDefinition, FusionCache, DataType, ...` gives nvFuser's Python
frontend; programs for it run with the module name changed (`nvfuser`, `nvfuser._C` and
`torch._C._nvfuser` -> `pyfuser` or `pyfuser._C`, `nvfuser.pytorch_utils` ->
`pyfuser.pytorch_utils`; docs/nvfuser_frontend.md). The names load lazily, so `import pyfuser`
stays cheap (no torch import until they are used).
"""
__version__ = "0.1.0"

_LAZY = {
    "Fusion": ("pyfuser.frontend.definition", "Fusion"),
    "FusionDefinition": ("pyfuser.frontend.definition", "FusionDefinition"),
    "FusionCache": ("pyfuser.frontend.fusion_cache", "FusionCache"),
    "Tensor": ("pyfuser.frontend.definition_values", "Tensor"),
    "Scalar": ("pyfuser.frontend.definition_values", "Scalar"),
    "DataType": ("pyfuser.ir.dtypes", "DataType"),
    "compute_contiguity": ("pyfuser.frontend.definition_tensors", "compute_contiguity"),
    "version": ("pyfuser.nvfuser_version", "version"),
    "jit": ("pyfuser.frontend.torchscript.fuse_api", "jit"),
    "fuse_graph": ("pyfuser.frontend.torchscript.fuse_api", "fuse_graph"),
    "compile": ("pyfuser.frontend.fx.backend", "compile"),
    "backend": ("pyfuser.frontend.fx.backend", "pyfuser_backend"),
    "explain": ("pyfuser.explainer", "explain"),
}
__all__ = ["Fusion", "FusionDefinition", "FusionCache", "Tensor", "Scalar", "DataType",
           "compute_contiguity", "version", "jit", "fuse_graph", "compile", "backend", "explain",
           "__version__"]


def _dump_help() -> None:
    """`PYFUSER_DUMP=help`: list the dump options as soon as pyfuser is imported."""
    import os
    if "help" in os.environ.get("PYFUSER_DUMP", "").split(","):
        from .dump import enabled_dumps
        enabled_dumps()


_dump_help()


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pyfuser' has no attribute {name!r}")
