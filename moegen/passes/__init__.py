"""Compiler passes: base.py (the Pass class and its options), manager.py (pipeline strings and
the pass manager), pipelines.py (the default pipelines), registry.py (every pass, registered
here on import, and their documentation)."""
from . import registry  # noqa: F401  (defines, and so registers, every pass)
