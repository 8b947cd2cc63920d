"""FlagGems 5.0.2: index_select with an index tensor that is not contiguous (every other element of a longer
one, a slice, a column of a 2-D tensor) selects the wrong rows; torch selects the rows the index holds.

Needs a CUDA GPU (FlagGems does not import without one). Run: python index_select_strided_index.py

What FlagGems' code does (`flag_gems/ops/index_select.py`): `index_select_kernel` loads the indices as
`tl.load(index + cols_offsets, ...)`, the index's elements at unit stride, and the wrapper `index_select`
passes `index` as given, without `.contiguous()` and without its stride. For an index of stride 2 the kernel
reads the first `len(index)` elements of the underlying storage (every element of the longer tensor, not
every other one), so the output holds other rows than those asked for. Only the index's layout matters: the
input is made contiguous along the selected dimension by `dim_compress`.

The script selects rows with a strided index and with its contiguous copy, through FlagGems and torch, and
compares each with float64.
"""

import flag_gems
import torch

DEV = "cuda"


def main():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=gen).to(DEV)
    longer = torch.randint(0, 64, (40,), generator=gen).to(DEV)
    strided = longer[::2]  # 20 indices, stride 2
    assert not strided.is_contiguous()
    want = torch.index_select(x.double(), 0, strided)
    for name, index in (("strided index", strided), ("contiguous copy", strided.contiguous())):
        got = flag_gems.index_select(x, 0, index)
        ref = torch.index_select(x, 0, index)
        torch.cuda.synchronize()
        gems_err = (got.double() - want).abs().max().item()
        torch_err = (ref.double() - want).abs().max().item()
        print(f"{name:16s} (stride {index.stride()[0]}): max abs error FlagGems {gems_err:.3g}, torch {torch_err:.3g}")
        if gems_err > 0:
            wrong = int(((got.double() - want).abs().amax(dim=1) > 0).sum())
            print(f"DEFECT index_select with a {name}: {wrong} of {index.numel()} selected rows are other rows than "
                  f"the index names (torch: exact)")


if __name__ == "__main__":
    main()
