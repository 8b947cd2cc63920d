"""kgate: contract-grade correctness gates for GPU kernels."""

__version__ = "0.1.0"
