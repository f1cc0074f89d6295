"""`pyfuser._C`: the names nvFuser's programs import from `nvfuser._C` (and pytorch's
`torch._C._nvfuser`), so `from nvfuser._C import Fusion, FusionCache, FusionDefinition,
DataType` runs as `from pyfuser._C import ...`. Everything here is pyfuser's Python frontend."""
from .frontend.definition import Fusion, FusionDefinition  # noqa: F401
from .frontend.definition_tensors import compute_contiguity  # noqa: F401
from .frontend.definition_values import Scalar, Tensor  # noqa: F401
from .frontend.fusion_cache import FusionCache  # noqa: F401
from .ir.dtypes import DataType  # noqa: F401
from .nvfuser_version import version  # noqa: F401

__all__ = ["Fusion", "FusionDefinition", "FusionCache", "DataType", "Tensor", "Scalar",
           "compute_contiguity", "version"]
