"""Code generation targets: cuda (CUDA C++ through CuPy) and ascend (AscendC op projects)."""
