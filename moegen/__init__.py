"""moegen: a small MLIR-style code generator for W4A16 MoE and MSD matmul kernels."""
__version__ = "0.1.0"

from .build import build
from .spec import Spec, SpecError, load_spec

__all__ = ["Spec", "SpecError", "__version__", "build", "load_spec"]
