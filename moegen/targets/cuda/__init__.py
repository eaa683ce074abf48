"""The CUDA target: emitter (IR -> .cu through templates/cuda) and runtime (CuPy RawModule)."""
from .runtime import CudaUnavailable, MoeW4A16, MsdMatmul, PackedMoeWeights

__all__ = ["CudaUnavailable", "MoeW4A16", "MsdMatmul", "PackedMoeWeights"]
