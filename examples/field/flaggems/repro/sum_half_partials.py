"""FlagGems 5.0.2: sum() of a float16 (or bfloat16) tensor rounds its partial sums to the input's dtype,
so its error grows with the number of partials, far past torch's.

Needs a CUDA GPU for FlagGems (the emulation below is plain torch). Run: python sum_half_partials.py

What FlagGems' code does (`flag_gems/ops/sum.py`, `sum`): it splits the M elements into
`mid_size = cdiv(M, block_size)` blocks of `block_size = next_power_of_2(ceil(sqrt(M)))`;
`sum_kernel_1` sums a block in float32 and stores it into `mid`, allocated with the input's dtype
(`torch.empty((mid_size,), dtype=dtype)`), and `sum_kernel_2` adds those rounded partials in float32.
Each partial is rounded to half precision once, so the result carries about sqrt(mid_size) half-precision
roundings of numbers much larger than the inputs. torch's CUDA sum keeps float32 accumulators and rounds
once, at the end. The 2-pass max/min/amax have the same structure but lose nothing by it; the sum does.

For the manifest's inputs (randn * 3, shape (8, 50, 777), float16: 304 partials of 1024 elements) the
GPU run found FlagGems 0.37 from the float64 sum (35.91 vs 36.28), torch 0.0049. The script prints, per
seed, the float64 sum, torch's and FlagGems' float16 sums and an emulation of FlagGems' two passes in
plain torch (partials rounded to float16), which shows where the error comes from.
"""

import math

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def emulated_sum(x):
    """FlagGems' two passes in plain torch: float32 block sums rounded to x's dtype, then summed."""
    m = x.numel()
    block = 1 << max(0, math.ceil(math.sqrt(m)) - 1).bit_length()  # triton.next_power_of_2
    mid = -(-m // block)
    flat = torch.zeros(mid * block, dtype=torch.float32, device=x.device)
    flat[:m] = x.reshape(-1).float()
    partials = flat.view(mid, block).sum(dim=1).to(x.dtype)
    return partials.float().sum().to(x.dtype), mid, block


def main():
    gems_sum = None
    if DEV == "cuda":
        import flag_gems
        gems_sum = flag_gems.sum
    else:
        print("no CUDA GPU: FlagGems cannot run here; the emulation alone follows")
    worst = (0.0, 0.0, None)
    for dtype in (torch.float16, torch.bfloat16):
        for seed in range(4):
            gen = torch.Generator().manual_seed(seed)
            x = (torch.randn(8, 50, 777, generator=gen, dtype=torch.float64) * 3).to(dtype).to(DEV)
            truth = x.double().sum().item()
            ref = torch.sum(x).item()
            emu, mid, block = emulated_sum(x)
            line = (f"{str(dtype):14s} seed {seed}: float64 {truth:.5f}, torch {ref:.5f} (error {abs(ref - truth):.3g}), "
                    f"emulated 2-pass {emu.item():.5f} (error {abs(emu.item() - truth):.3g}; {mid} partials of {block})")
            if gems_sum is not None:
                got = gems_sum(x).item()
                line += f", FlagGems {got:.5f} (error {abs(got - truth):.3g})"
                if dtype == torch.float16 and abs(got - truth) / max(abs(ref - truth), 1e-30) > worst[0]:
                    worst = (abs(got - truth) / max(abs(ref - truth), 1e-30), abs(got - truth),
                             (seed, truth, ref, got))
            print(line)
    if worst[2] is not None:
        ratio, err, (seed, truth, ref, got) = worst
        ulp = 2.0 ** (math.floor(math.log2(abs(truth))) - 10) if truth else 2.0 ** -24
        if ratio > 4 and err > ulp:
            print(f"DEFECT sum(float16 (8, 50, 777), seed {seed}): FlagGems {got:.5f} is {err:.3g} from the float64 "
                  f"sum {truth:.5f} ({err / ulp:.1f} float16 ulps, {ratio:.0f} x torch's error {abs(ref - truth):.3g})")


if __name__ == "__main__":
    main()
