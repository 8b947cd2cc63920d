"""A model of tensor-core float32 accumulation for the Triton interpreter (the CPU test path).

NVIDIA tensor cores multiply exactly but add each k-step's products into the float32 accumulator with
truncation (round toward zero), not IEEE round to nearest (Fasi et al., "Numerical behavior of NVIDIA
tensor cores", PeerJ CS 2021; Ootomo and Yokota, IJHPCA 2022). Chained `tl.dot(a, b, acc)` calls thus
lose up to an ulp of |acc| per k-step, always toward zero: on the H200 that put the GDN float32
backward 3 % past kgate's oracle bound. The interpreter's dot is exact-then-round-to-nearest, so
without this model the CPU tests cannot see it. `truncating_tensor_cores()` replaces the interpreter's
dot on float32 operands with exact products summed K_STEP at a time into the accumulator, each sum
truncated to float32.
"""

from __future__ import annotations

import contextlib

import numpy as np

K_STEP = 8  # one Hopper TF32 wgmma instruction's k


def _toward_zero(x: np.ndarray) -> np.ndarray:
    """float64 -> float32, rounded toward zero."""
    y = x.astype(np.float32)
    over = np.abs(y.astype(np.float64)) > np.abs(x)
    y[over] = np.nextafter(y[over], np.float32(0))
    return y


@contextlib.contextmanager
def truncating_tensor_cores():
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    exact_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if not (a.data.dtype == b.data.dtype == d.data.dtype == np.float32):
            return exact_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        A, B = a.data.astype(np.float64), b.data.astype(np.float64)
        acc = d.data.astype(np.float32)
        for k in range(0, A.shape[-1], K_STEP):
            acc = _toward_zero(A[..., k:k + K_STEP] @ B[..., k:k + K_STEP, :] + acc)
        return interpreter.TensorHandle(acc, d.dtype.scalar)

    builder.create_dot = create_dot
    try:
        yield
    finally:
        builder.create_dot = exact_dot
