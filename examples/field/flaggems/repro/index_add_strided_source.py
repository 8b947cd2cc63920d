"""FlagGems 5.0.2: index_add with a source tensor that is not contiguous (a slice of a wider one, a transposed
view) adds its elements to the wrong places; torch adds each to the row the index names.

Needs a CUDA GPU for FlagGems (the emulation below is plain torch). Run: python index_add_strided_source.py

What FlagGems' code does (`flag_gems/ops/index_add.py`, the generated kernel): for each source element it
computes `src_offset`, the element's memory offset from the source's own strides, and then derives the
destination from that offset as if it were the element's position in a contiguous source laid out like the
output: `pre_idx = src_offset // (inp_stride_dim * src_shape_dim)`, `dim_idx = src_offset % pre_cal //
inp_stride_dim`, `input_idx = src_offset + (delta * pre_idx + index[dim_idx] - dim_idx) * inp_stride_dim`.
For a strided source the memory offset is not that position, so the element lands in another row and
column (or past the row, masked only at the end of the output). The wrapper passes `src` as given.

kgate's layouts gate found it on the GPU: index_add of (1024, 771) rows with the source sliced (strides
(771, 1), offset 772), 4.58 off at out[442, 226]. The script prints where the emulated kernel puts each
source element of a small case, and on a GPU compares FlagGems and torch with float64.
"""

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def emulated_index_add(inp, index, src):
    """The generated kernel's index arithmetic for dim 0, in plain torch (float64, no atomics needed here)."""
    out = inp.double().clone().reshape(-1)
    inp_stride_dim, src_shape_dim = inp.stride(0), src.shape[0]
    delta, pre_cal = inp.shape[0] - src_shape_dim, inp_stride_dim * src_shape_dim
    for r in range(src.shape[0]):
        for c in range(src.shape[1]):
            src_offset = r * src.stride(0) + c * src.stride(1)
            pre_idx, dim_idx = src_offset // pre_cal, src_offset % pre_cal // inp_stride_dim
            input_idx = src_offset + (delta * pre_idx + int(index[dim_idx]) - dim_idx) * inp_stride_dim
            if input_idx < out.numel():
                out[input_idx] += float(src[r, c])
    return out.reshape(inp.shape)


def main():
    gen = torch.Generator().manual_seed(0)
    inp = torch.zeros(8, 5, dtype=torch.float64)
    index = torch.tensor([1, 3, 5])
    wide = torch.randn(3, 8, generator=gen, dtype=torch.float64)
    for name, src in (("sliced source (strides (8, 1))", wide[:, :5]),
                      ("contiguous copy", wide[:, :5].contiguous())):
        want = torch.index_add(inp, 0, index, src)
        emulated = emulated_index_add(inp, index, src)
        line = f"{name}: emulated kernel max abs error {(emulated - want).abs().max().item():.3g}"
        if DEV == "cuda":
            import flag_gems

            got = flag_gems.index_add(inp.float().to(DEV), 0, index.to(DEV), src.float().to(DEV))
            err = (got.double().cpu() - want).abs().max().item()
            line += f", FlagGems {err:.3g}, torch float32 " \
                    f"{(torch.index_add(inp.float(), 0, index, src.float()).double() - want).abs().max().item():.3g}"
            if err > 1e-5:
                print(line)
                print(f"DEFECT index_add with a {name}: FlagGems is {err:.3g} off torch's float64 index_add")
                continue
        print(line)
    if DEV != "cuda":
        print("no CUDA GPU: FlagGems cannot run here; the emulation alone is shown")


if __name__ == "__main__":
    main()
