"""`no_grad: [i, ...]`: arguments that get no gradient by contract (a teacher's distribution, a target).
The gradients' phase passes them as plain tensors, to the kernel, the reference and the float64 oracle,
and judges the other inputs' gradients only: a kernel whose backward returns None for them passes, and
a wrong gradient of another input still fails. Forward judging is unchanged."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kgate import gates as registry
from kgate.backward import BackwardSubject
from kgate.cli import main
from kgate.errors import ManifestError
from kgate.manifest import load
from kgate.subject import UserCodeError
from tests.gate_harness import subject_for
from tests.test_manifest import KERNEL_PY


def distributions(seed, shape=None, dtype=torch.float32):
    """A student's log-probabilities and a teacher's probabilities, rows of 9 classes."""
    gen = torch.Generator().manual_seed(seed)
    log_q = torch.log_softmax(2 * torch.randn(4, 9, generator=gen, dtype=torch.float64), dim=-1)
    p = torch.softmax(2 * torch.randn(4, 9, generator=gen, dtype=torch.float64), dim=-1)
    return log_q.to(dtype), p.to(dtype)


def kl_reference(log_q, p):
    return F.kl_div(log_q, p, reduction="sum")


def kl_reference_detached_target(log_q, p):
    """A reference written as the contract reads: the target is a constant."""
    return F.kl_div(log_q, p.detach(), reduction="sum")


class KLTargetGetsNone(torch.autograd.Function):
    """sum p * (log p - log q), with the gradient of the student only (as Liger's ops/kl_div.py)."""

    @staticmethod
    def forward(ctx, log_q, p):
        ctx.save_for_backward(p)
        return torch.xlogy(p, p).sum() - (p * log_q).sum()

    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return -p * grad, None


class KLWrongStudentGradient(KLTargetGetsNone):
    @staticmethod
    def backward(ctx, grad):
        (p,) = ctx.saved_tensors
        return p * grad, None  # the sign of d/d log_q lost


def backward_oracle(kernel, reference=kl_reference, **options):
    subject = BackwardSubject(subject_for(kernel, reference, distributions, backward=True, **options))
    return registry.get("oracle").check(subject)


def test_a_target_without_gradient_fails_unless_declared():
    undeclared = backward_oracle(KLTargetGetsNone.apply)
    assert undeclared.verdict == "fail" and undeclared.where.startswith("out[1]"), undeclared.message
    declared = backward_oracle(KLTargetGetsNone.apply, no_grad=[1])
    assert declared.verdict == "pass", declared.message


def test_declaring_the_target_does_not_hide_a_wrong_student_gradient():
    result = backward_oracle(KLWrongStudentGradient.apply, no_grad=[1])
    assert result.verdict == "fail" and result.where.startswith("out[0]"), result.message
    assert "max abs error" in result.message


def test_a_kernel_that_differentiates_the_target_anyway_passes():
    """Training passes the target with requires_grad False: autograd discards any gradient for it."""
    result = backward_oracle(lambda log_q, p: F.kl_div(log_q, p, reduction="sum"), no_grad=[1])
    assert result.verdict == "pass", result.message


def test_a_reference_that_detaches_the_target_passes_gradcheck_only_when_declared():
    with pytest.raises(UserCodeError, match="gradcheck") as info:
        backward_oracle(KLTargetGetsNone.apply, reference=kl_reference_detached_target)
    assert info.value.role == "reference (float64 autograd)"
    result = backward_oracle(KLTargetGetsNone.apply, reference=kl_reference_detached_target, no_grad=[1])
    assert result.verdict == "pass", result.message


def test_contract_calls_the_kernel_with_the_target_not_requiring_grad():
    """The forward phase's requires_grad check calls the kernel as training does: a kernel that refuses a
    target that requires grad is right when the target is declared no_grad."""

    def refuses_a_target_with_grad(log_q, p):
        if p.requires_grad:
            raise ValueError("the target must not require grad")
        return KLTargetGetsNone.apply(log_q, p)

    def contract(**options):
        subject = subject_for(refuses_a_target_with_grad, kl_reference, distributions, backward=True, **options)
        return registry.get("contract").check(subject)

    assert contract(no_grad=[1]).verdict == "pass"
    with pytest.raises(UserCodeError, match="must not require grad"):
        contract()


def test_every_input_declared_is_a_clear_error():
    with pytest.raises(UserCodeError, match=r"are declared no_grad: is every input that gets a gradient"):
        backward_oracle(KLTargetGetsNone.apply, no_grad=[0, 1])


def test_an_index_past_the_factory_arguments_is_an_error_naming_the_key():
    expected = r"no_grad names argument\(s\) \[5\], but the inputs factory made 2"
    with pytest.raises(UserCodeError, match=expected) as info:
        backward_oracle(KLTargetGetsNone.apply, no_grad=[5])
    assert info.value.role == "manifest (no_grad)"


# -- the manifest ------------------------------------------------------------------------------------------

ENTRY = """\
version: 1
kernels:
  - name: kl
    kernel: k.py:kern
    reference: k.py:ref
"""


def problem_for(write_manifest, lines: str):
    path = write_manifest(ENTRY + lines, {"k.py": KERNEL_PY})
    with pytest.raises(ManifestError) as info:
        load(path, check_files=False)
    (problem,) = info.value.problems
    return problem


@pytest.mark.parametrize(("lines", "message", "hint"), [
    ("    inputs: k.py:make_inputs\n    no_grad: [1]\n", "backward is false", "add `backward: true`"),
    ("    inputs: [{shape: [4]}, {shape: [4]}]\n    backward: true\n    no_grad: [2]\n",
     "argument 2 is not one of the 2 declared inputs", "0 to 1 here"),
    ("    inputs: [{shape: [4]}, {shape: [4], dtype: int64, low: 0, high: 4}]\n    backward: true\n"
     "    no_grad: [1]\n", "argument 1 is a tensor of dtype int64: only floating-point tensors get gradients",
     "leave 1 out of no_grad"),
    ("    inputs: [{shape: [4]}, {value: 0.5}]\n    backward: true\n    no_grad: [1]\n",
     "argument 1 is a Python scalar", "leave 1 out of no_grad"),
    ("    inputs: k.py:make_inputs\n    backward: true\n    no_grad: true\n",
     "no_grad takes the indices of the arguments", "no_grad: [1]"),
])
def test_manifest_problems_name_file_line_key_and_what_to_do(write_manifest, lines, message, hint):
    problem = problem_for(write_manifest, lines)
    assert message in problem.message, problem
    assert hint in (problem.hint or ""), problem
    assert problem.key == "kernels[0].no_grad" and problem.line == ENTRY.count("\n") + lines.count("\n")


def test_a_bad_no_grad_exits_2(write_manifest, capsys):
    path = write_manifest(ENTRY + "    inputs: [{shape: [4]}]\n    backward: true\n    no_grad: [3]\n",
                          {"k.py": KERNEL_PY})
    assert main(["run", str(path), "--out", str(path.parent / "out")]) == 2
    assert "kernels[0].no_grad" in capsys.readouterr().err


def test_declared_floating_inputs_are_accepted(write_manifest):
    lines = "    inputs: [{shape: [4]}, {shape: [4]}]\n    backward: true\n    no_grad: [1]\n"
    path = write_manifest(ENTRY + lines, {"k.py": KERNEL_PY})
    assert load(path, check_files=False).kernels[0].entry.no_grad == [1]
