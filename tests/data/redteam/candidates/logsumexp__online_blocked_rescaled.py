import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Correct: online logsumexp over blocks of 16 columns, the running max started at -inf and the shift
    zeroed where it is infinite; the carried sum is always rescaled by exp(m - shift), so a +inf seen in an
    early block stays +inf (inf * inf), an all -inf row stays -inf (0 * 0) and NaN stays NaN."""

    BLOCK = 16

    def forward(self, x):
        m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
        s = torch.zeros_like(m)
        for j in range(0, x.shape[-1], self.BLOCK):
            blk = x[..., j:j + self.BLOCK]
            m_new = torch.maximum(m, blk.amax(dim=-1))
            shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            s = s * torch.exp(m - shift) + torch.exp(blk - shift.unsqueeze(-1)).sum(dim=-1)
            m = m_new
        shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        return torch.log(s) + shift
