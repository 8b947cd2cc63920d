"""FlagGems 5.0.2 ops as kgate kernels (examples/field/flaggems).

Each kernel calls FlagGems' own op function from the `flag_gems` namespace (what `flag_gems.enable()`
registers for the ATen op, with the device's architecture-specific replacements, e.g. Hopper's mm),
never through `flag_gems.enable()`: that would patch torch, and with it the reference. A wrapper only
adapts the calling convention: a constant dim or flag, keyword arguments, a namedtuple unpacked into a
plain tuple, the argument order of torch.nn.functional.

Training ops (softmax, log_softmax, layer_norm, rms_norm, embedding, gelu, silu, sigmoid) have a
backward: FlagGems' forward op returns a tensor without autograd history, and under `enable()` torch's
autograd formula calls the ATen backward op, which FlagGems also registers (`_softmax_backward_data`,
`native_layer_norm_backward`, `embedding_dense_backward`, ...). The `torch.autograd.Function`s below wire
FlagGems' forward to FlagGems' backward with the arguments torch's autograd formula passes (what
`derivatives.yaml` saves: the output for softmax and sigmoid, the input for gelu and silu, mean and
rstd for layer_norm). rms_norm is already an autograd.Function in FlagGems.

FlagGems finds its device when it is imported and raises RuntimeError without one (5.0.2 knows no CPU
vendor; its `_arm` CPU backend is not in its vendor list). On a machine without CUDA this module still
imports and every kernel raises that error, naming it; with CUDA the import error propagates.
"""

from __future__ import annotations

import torch
from flaggems_ref import ADDMM_ALPHA, ADDMM_BETA, CLAMP_MAX, CLAMP_MIN, EPS_NORM, INDEX_ADD_ALPHA, NAN_TO_NUM

try:
    import flag_gems
    IMPORT_ERROR: BaseException | None = None
except Exception as exc:  # FlagGems 5.0.2: RuntimeError "No device were detected on your machine"
    if torch.cuda.is_available():
        raise
    flag_gems = None
    IMPORT_ERROR = exc


def _gems(name: str):
    """FlagGems' op `name` from the `flag_gems` namespace; raises the import's error where FlagGems
    could not import (no GPU)."""
    if flag_gems is None:
        raise RuntimeError(f"FlagGems cannot run here: importing flag_gems raised "
                           f"{type(IMPORT_ERROR).__name__}: {str(IMPORT_ERROR).strip()}") from IMPORT_ERROR
    return getattr(flag_gems, name)


# ------------------------------------------------------------------------------------------------
# Reductions


def sum_all(x):
    return _gems("sum")(x)


def sum_dim(x):
    return _gems("sum_dim")(x, [-1])


def mean_dim(x):
    return _gems("mean_dim")(x, [-1])


def var_mean(x):
    var, mean = _gems("var_mean")(x, [-1], correction=1)
    return var, mean


def cumsum(x):
    return _gems("cumsum")(x, -1)


def argmax(x):
    return _gems("argmax")(x, -1)


def max_dim(x):
    values, indices = _gems("max_dim")(x, -1)
    return values, indices


def min_dim(x):
    values, indices = _gems("min_dim")(x, -1)
    return values, indices


def amax(x):
    return _gems("amax")(x, [-1])


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = _gems("softmax")(x, -1, False)
        ctx.save_for_backward(y)
        ctx.input_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _gems("softmax_backward")(dy, y, -1, ctx.input_dtype)


class _LogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = _gems("log_softmax")(x, -1, False)
        ctx.save_for_backward(y)
        ctx.input_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _gems("log_softmax_backward")(dy, y, -1, ctx.input_dtype)


def softmax(x):
    return _Softmax.apply(x)


def log_softmax(x):
    return _LogSoftmax.apply(x)


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        shape = [x.shape[-1]]
        y, mean, rstd = _gems("layer_norm")(x, shape, weight, bias, EPS_NORM)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.shape = shape
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
        dx, dw, db = _gems("layer_norm_backward")(dy, x, ctx.shape, mean, rstd, weight, bias, mask)
        return dx, dw, db


def layer_norm(x, weight, bias):
    return _LayerNorm.apply(x, weight, bias)


def rms_norm(x, weight):
    return _gems("rms_norm")(x, [x.shape[-1]], weight, EPS_NORM)


# ------------------------------------------------------------------------------------------------
# Pointwise


def exp(x):
    return _gems("exp")(x)


def log(x):
    return _gems("log")(x)


def rsqrt(x):
    return _gems("rsqrt")(x)


class _Sigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = _gems("sigmoid")(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _gems("sigmoid_backward")(dy, y)


class _Silu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _gems("silu")(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _gems("silu_backward")(dy, x)


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return _gems("gelu")(x, approximate=approximate)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _gems("gelu_backward")(dy, x, approximate=ctx.approximate), None


def sigmoid(x):
    return _Sigmoid.apply(x)


def silu(x):
    return _Silu.apply(x)


def gelu(x):
    return _Gelu.apply(x, "none")


def gelu_tanh(x):
    return _Gelu.apply(x, "tanh")


def pow(base, exponent):  # noqa: A001 - the op's name
    return _gems("pow_tensor_tensor")(base, exponent)


def div(a, b):
    return _gems("true_divide")(a, b)


def maximum(a, b):
    return _gems("maximum")(a, b)


def where(cond, a, b):
    return _gems("where_self")(cond, a, b)


def clamp(x):
    return _gems("clamp")(x, CLAMP_MIN, CLAMP_MAX)


def isnan(x):
    return _gems("isnan")(x)


def isinf(x):
    return _gems("isinf")(x)


def nan_to_num(x):
    return _gems("nan_to_num")(x, NAN_TO_NUM["nan"], NAN_TO_NUM["posinf"], NAN_TO_NUM["neginf"])


# ------------------------------------------------------------------------------------------------
# Matrix products


def mm(a, b):
    return _gems("mm")(a, b)


def addmm(bias, a, b):
    return _gems("addmm")(bias, a, b, beta=ADDMM_BETA, alpha=ADDMM_ALPHA)


def bmm(a, b):
    return _gems("bmm")(a, b)


# ------------------------------------------------------------------------------------------------
# Embedding and index ops


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indices, weight):
        ctx.save_for_backward(indices)
        ctx.num_weights = weight.shape[0]
        return _gems("embedding")(weight, indices)

    @staticmethod
    def backward(ctx, dy):
        (indices,) = ctx.saved_tensors
        return None, _gems("embedding_backward")(dy, indices, ctx.num_weights, -1, False, False)


def embedding(indices, weight):
    """torch.nn.functional.embedding's argument order (indices, weight); FlagGems' is (weight, indices)."""
    return _Embedding.apply(indices, weight)


def index_select(x, index):
    return _gems("index_select")(x, 0, index)


def gather(x, index):
    return _gems("gather")(x, 1, index)


def scatter(x, index, src):
    return _gems("scatter")(x, 1, index, src)


def index_add(x, index, src):
    return _gems("index_add")(x, 0, index, src, alpha=INDEX_ADD_ALPHA)
