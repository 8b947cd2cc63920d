"""FlagGems 5.0.2: scatter into an input that is not dense (every other column of a wider tensor) writes its
values at the input's strides into a clone that has other strides: into the wrong elements, and past the
end of the output.

Needs a CUDA GPU for FlagGems (the emulation below is plain torch). Run: python scatter_strided_input.py

What FlagGems' code does (`flag_gems/ops/scatter.py`, `scatter`): `out = inp.clone()`, which for a tensor
that is not dense (a view of every other column) is a new dense tensor, strides (N, 1); the generated kernel
computes each destination as `sum(mod_i * inp_stride_i) + index * inp.stride(dim)` from `inp`'s strides
((2N, 2) for every other column, through `restride_dim(inp, ...)` and `dim_stride = inp.stride(dim)`) and
stores at `out + inp_offsets`. The offsets of one tensor are used on the memory of another. torch's scatter
writes into the clone at the clone's strides.

kgate's layouts gate found it on the GPU: scatter of (128, 1000) rows with every argument at every other
element, 5.24 off at out[91, 384]. The script emulates the kernel's offsets for a small case in plain torch
(where each value lands, and how many land past the output), and on a GPU compares FlagGems with torch.
"""

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def emulated_scatter(inp, dim, index, src):
    """The kernel's destinations, computed from `inp`'s strides, applied to `inp.clone()`'s memory."""
    out = inp.clone()
    flat = out.reshape(-1) if out.is_contiguous() else None
    assert flat is not None, "the clone of a non-dense tensor is dense"
    strides = list(inp.stride())
    strides[dim] = 0
    past = 0
    for pos in torch.cartesian_prod(*[torch.arange(s) for s in index.shape]).tolist():
        offset = sum(p * s for p, s in zip(pos, strides)) + int(index[tuple(pos)]) * inp.stride(dim)
        value = src[tuple(pos)]
        if offset < flat.numel():
            flat[offset] = value
        else:
            past += 1
    return out, past


def main():
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(4, 12, generator=gen, dtype=torch.float64)
    index = torch.randint(0, 6, (4, 3), generator=gen)
    src = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    for name, inp in (("every other column (strides (12, 2))", wide[:, ::2]),
                      ("contiguous copy", wide[:, ::2].contiguous())):
        want = torch.scatter(inp, 1, index, src)
        emulated, past = emulated_scatter(inp, 1, index, src)
        line = (f"{name}: emulated kernel max abs error {(emulated - want).abs().max().item():.3g}, "
                f"{past} of {index.numel()} values written past the output")
        if DEV == "cuda":
            import flag_gems

            got = flag_gems.scatter(inp.float().to(DEV), 1, index.to(DEV), src.float().to(DEV))
            err = (got.double().cpu() - want).abs().max().item()
            line += f", FlagGems {err:.3g}"
            if err > 1e-6:
                print(line)
                print(f"DEFECT scatter into an input of {name}: FlagGems is {err:.3g} off torch's scatter")
                continue
        print(line)
    if DEV != "cuda":
        print("no CUDA GPU: FlagGems cannot run here; the emulation alone is shown")


if __name__ == "__main__":
    main()
