"""Parameters a reference's forward writes in place (an optimizer step as a module, an embedding's max_norm
renormalisation) kept in lockstep with the kernel's, as buffers are (kgate.subject.Lockstep)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.gate_harness import check, normal_inputs, subject_for

N = 512


class _Lion(torch.nn.Module):
    """One Lion step per call: the parameter and its momentum buffer updated in place, the new parameter returned."""

    def __init__(self):
        super().__init__()
        self.param = torch.nn.Parameter(torch.linspace(-2.0, 2.0, N))
        self.register_buffer("exp_avg", torch.zeros(N))

    def forward(self, grad):
        with torch.no_grad():
            update = torch.sign(self.exp_avg * 0.9 + grad * 0.1)
            self.param.mul_(1 - 0.02 * 0.1).add_(update, alpha=-0.02)
            self.exp_avg.mul_(0.99).add_(grad, alpha=0.01)
            return self.param.detach().clone()


class _LionFused(_Lion):
    """The same step with the decay and the update fused into one expression (other roundings)."""

    def forward(self, grad):
        with torch.no_grad():
            m = self.exp_avg
            update = torch.sign(torch.lerp(grad, m, 0.9))
            self.param.copy_(self.param - 0.02 * (update + 0.1 * self.param))
            m.lerp_(grad, 0.01)
            return self.param.detach().clone()


class _LionStale(_Lion):
    """Forgets the momentum: right at the first step from zero momentum only."""

    def forward(self, grad):
        with torch.no_grad():
            update = torch.sign(grad)
            self.param.mul_(1 - 0.02 * 0.1).add_(update, alpha=-0.02)
            self.exp_avg.mul_(0.99).add_(grad, alpha=0.01)
            return self.param.detach().clone()


_grads = normal_inputs((N,))


def test_a_parameter_the_reference_writes_joins_the_lockstep_state_after_its_first_call():
    subject = subject_for(_LionFused(), _Lion(), _grads)
    lock = subject.lockstep
    assert lock is not None and lock.written == []
    args = subject.inputs(subject.first_seed_cases()[0])
    subject.run_reference(args)
    assert lock.written == ["param"] and lock.stateful
    state = lock.state["param"].clone()
    subject.run_reference(args)
    subject.run_kernel(args)  # both start from the state: neither drifts from the other
    assert torch.equal(lock.state["param"], state)
    assert torch.allclose(subject.modules()[0].param.detach(), subject.modules()[1].param.detach(), atol=0.05)


def test_a_correct_step_that_writes_its_parameter_passes_the_gates_that_call_it_unequally_often():
    for gate in ("distributions", "isolation", "determinism", "oracle"):
        result = check(gate, _LionFused(), _Lion(), _grads)
        assert result.verdict == "pass", (gate, result.message)


def test_a_step_that_forgets_its_momentum_still_fails():
    result = check("oracle", _LionStale(), _Lion(), _grads)
    assert result.verdict == "fail", result.message


class _Table(torch.nn.Module):
    """An embedding whose rows are renormalised in place to max_norm 1 as they are looked up."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(64, 16, generator=torch.Generator().manual_seed(3)))

    def forward(self, idx):
        return F.embedding(idx.long(), self.weight, max_norm=1.0)


class _TableScaled(_Table):
    """The same renormalisation, its norm taken as m ||row / m|| (m the row's largest magnitude: no overflow)
    and its factor 1 / norm: a row it renormalised can come out a rounding above 1 and be renormalised again
    at its next lookup, its last bits moving from call to call, where torch's 1 / (norm + 1e-7) leaves it
    below 1 for good."""

    def forward(self, idx):
        idx = idx.long()
        with torch.no_grad():
            rows = torch.unique(idx)
            picked = self.weight[rows]
            m = picked.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
            norm = torch.linalg.vector_norm(picked / m, dim=1, keepdim=True) * m
            self.weight[rows] = torch.where(norm > 1.0, picked / norm, picked)
        return self.weight[idx]


def _ids(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 64, shape or (8, 12), generator=gen),)


def test_a_table_renormalised_in_place_by_both_is_not_taken_for_a_memoized_result():
    result = check("isolation", _TableScaled(), _Table(), _ids)
    assert result.verdict == "pass", result.message


class _LionStoresOtherwise(_Lion):
    """Returns the right new parameter, but stores another one (an update applied twice where it writes back):
    under the lockstep every call starts from the reference's parameter, so only the stored one shows it."""

    def forward(self, grad):
        with torch.no_grad():
            update = torch.sign(self.exp_avg * 0.9 + grad * 0.1)
            new = self.param * (1 - 0.02 * 0.1) - 0.02 * update
            self.param.copy_(new - 0.02 * update)
            self.exp_avg.mul_(0.99).add_(grad, alpha=0.01)
            return new.detach().clone()


def test_a_parameter_stored_otherwise_than_the_reference_stores_it_fails_the_sequence_of_calls():
    result = check("oracle", _LionStoresOtherwise(), _Lion(), _grads)
    assert result.verdict == "fail", result.message
    assert "over a sequence of calls on one state" in result.message and "parameter 'param'" in result.message
