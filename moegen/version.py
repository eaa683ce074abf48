"""moegen's version (its own module: every module may import it without importing the package)."""
__version__ = "0.1.0"
