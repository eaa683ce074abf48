"""moegen: a small MLIR-style code generator for W4A16 MoE and MSD matmul kernels."""
from .version import __version__
from .build import build
from .checkpoint import CheckpointError, load_moe_layer, read_moe_layer
from .spec import Spec, SpecError, load_spec

__all__ = ["CheckpointError", "Spec", "SpecError", "__version__", "build", "load_moe_layer",
           "load_spec", "read_moe_layer"]


def __getattr__(name):
    # `moegen.cuda` imports CuPy lazily: the compiler itself needs no GPU
    if name == "cuda":
        import importlib
        return importlib.import_module(".cuda", __name__)
    raise AttributeError(f"module 'moegen' has no attribute {name!r}")
