"""A kernel module that fails while being imported (e.g. a CUDA extension that does not build)."""

raise ImportError("cannot build extension: nvcc not found")


def kernel(x):
    return x
