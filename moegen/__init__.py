"""moegen: a small MLIR-style code generator for W4A16 MoE and MSD matmul kernels."""
__version__ = "0.1.0"

from .build import build
from .spec import Spec, SpecError, load_spec

__all__ = ["Spec", "SpecError", "__version__", "build", "load_spec"]


def __getattr__(name):
    # `moegen.cuda` imports CuPy lazily: the compiler itself needs no GPU
    if name == "cuda":
        import importlib
        return importlib.import_module(".cuda", __name__)
    raise AttributeError(f"module 'moegen' has no attribute {name!r}")
