# A ReLU as a CUDA C++ extension built with load_inline (nvcc), for the sandbox's GPU check
# (bench/sandbox_gpu.sh): the build and the kernel both run in each worker's sandbox. It maps NaN to 0
# (x > 0 ? x : 0) where torch.relu keeps NaN: special_values fails, rightly.
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = """
#include <torch/extension.h>
__global__ void relu_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu(torch::Tensor x) {
    auto c = x.contiguous();
    auto y = torch::empty_like(c);
    long n = c.numel();
    if (n > 0) relu_kernel<<<(n + 255) / 256, 256>>>(c.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(name="kgate_sandbox_relu", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                  cuda_sources=_CUDA, functions=["relu"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x)
