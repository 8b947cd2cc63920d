"""Gradients as a subject of the gates (`backward: true` in the manifest).

`BackwardSubject` turns a kernel and its reference into callables that return gradients, so every
gate judges the backward pass exactly as it judges the forward pass, and reports it as a separate
gate result with the id suffix `[backward]` (`oracle[backward]`, `determinism[backward]`, ...):

- arguments of the backward subject: the forward inputs of a case followed by one cotangent per
  floating-point output of the reference (random, seeded by the case, in the output's dtype);
- output: the gradients w.r.t. every floating-point input, then w.r.t. the parameters when kernel
  and reference are both `nn.Module`s with the same parameter names (an unused input gets zeros);
- arguments declared `no_grad` (indices; a teacher's distribution, a target) get no gradient by
  contract: kernel, reference and float64 oracle are called with them as plain tensors that do not
  require grad (as training calls them), no gradient of theirs is asked for or judged, and gradcheck
  leaves them fixed. A gradient the kernel's backward computes for them anyway is never seen: autograd
  discards a gradient for an input that does not require grad;
- the float64 oracle is autograd of the reference on float64 copies (modules are converted with
  `.double()`); before the first case is judged, `torch.autograd.gradcheck` (fast mode) checks that
  the reference's own float64 autograd agrees with finite differences, since it is the oracle. If
  it does not, every backward gate reports `error` and names the reference.

A kernel whose output does not require grad (no autograd.Function around a custom kernel) gets
`error` in every backward gate with that explanation. A gradient that aliases an argument (autograd
passes a cotangent through unchanged for some ops) is copied, so the contract gate does not call it
aliasing.
"""

from __future__ import annotations

from typing import Any

import torch

from kgate.compare import clone_tree, flatten, overlaps
from kgate.gates import BACKWARD_SUFFIX
from kgate.inputs import Case
from kgate.oracle import converted_copy, upcast
from kgate.subject import Subject, UserCodeError

COTANGENT_SEED = 1_000_003


def _float_tensor(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor) and (obj.is_floating_point() or obj.is_complex())


def shared_parameters(kernel: Any, reference: Any) -> bool:
    """Whether gradients w.r.t. parameters can be compared: both modules, same parameter names."""
    if not isinstance(kernel, torch.nn.Module) or not isinstance(reference, torch.nn.Module):
        return False
    names = [n for n, _ in kernel.named_parameters()]
    return bool(names) and names == [n for n, _ in reference.named_parameters()]


class GradientOf:
    """fn(*inputs) -> out becomes g(*inputs, *cotangents) -> (d<out, cot>/d input_i ..., d/d param ...)."""

    def __init__(self, fn: Any, role: str, layout: _Layout, with_params: bool,
                 no_grad: frozenset[int] = frozenset()):
        self.fn = fn
        self.role = role
        self.layout = layout
        self.with_params = with_params
        self.no_grad = no_grad
        self._converted: dict[tuple[torch.dtype, torch.device], torch.nn.Module] = {}

    def _module_for(self, leaves: list[Any]) -> Any:
        """The float64 oracle runs the reference module converted to float64 on the inputs' device."""
        if not isinstance(self.fn, torch.nn.Module):
            return self.fn
        floats = [a for a in leaves if _float_tensor(a)]
        params = list(self.fn.parameters())
        if not floats or not params or floats[0].dtype != torch.float64 or params[0].dtype == torch.float64:
            return self.fn
        key = (torch.float64, floats[0].device)
        if key not in self._converted:
            self._converted[key] = converted_copy(self.fn, device=floats[0].device, dtype=torch.float64)
        return self._converted[key]

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        n = self.layout.n_inputs
        if n is None or len(args) <= n:
            raise ValueError("backward subject called before its inputs were made (kgate bug)")
        inputs, cotangents = args[:n], args[n:]
        with torch.enable_grad():
            leaves = [a.detach() if i in self.no_grad and isinstance(a, torch.Tensor)
                      else a.detach().requires_grad_(True) if _float_tensor(a) else a
                      for i, a in enumerate(inputs)]
            fn = self._module_for(leaves)
            out = fn(*leaves)
            outs = [t for _, t in flatten(out) if _float_tensor(t)]
            if len(outs) != len(cotangents):
                raise ValueError(f"the {self.role} returned {len(outs)} floating-point output(s), the reference "
                                 f"{len(cotangents)}: cannot pair them with cotangents")
            params = list(fn.parameters()) if self.with_params else []
            wrt = [a for a in leaves if _float_tensor(a) and a.requires_grad] + params
            pairs = [(o, c.to(o.dtype) if c.dtype != o.dtype else c) for o, c in zip(outs, cotangents)
                     if o.requires_grad]
            if not pairs:
                declared = (f" (arguments {sorted(self.no_grad)} are declared no_grad: is every input that gets "
                            "a gradient among them?)" if self.no_grad else "")
                raise RuntimeError(f"no output of the {self.role} requires grad: it has no backward (wrap a "
                                   "custom kernel in a torch.autograd.Function), or declare backward: false"
                                   + declared)
            grads = torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], allow_unused=True)
        result = []
        for g, w in zip(grads, wrt):
            g = torch.zeros_like(w) if g is None else g.detach()
            if any(isinstance(a, torch.Tensor) and overlaps(g, a) for a in args):
                g = g.clone()
            result.append(g)
        return tuple(result)


class _Layout:
    """How many of the backward subject's arguments are forward inputs (the rest are cotangents)."""

    n_inputs: int | None = None


class _CotangentFactory:
    """Inputs of a backward case: the forward inputs, then seeded cotangents shaped like the
    reference's floating-point outputs."""

    def __init__(self, forward: Subject, layout: _Layout, no_grad: frozenset[int] = frozenset()):
        self.forward = forward
        self.layout = layout
        self.no_grad = no_grad

    @property
    def source(self) -> Any:
        """The forward factory's source (gates read it to learn whether inputs depend on the shape)."""
        return self.forward.factory.source

    def __call__(self, case: Case, device: torch.device) -> tuple[Any, ...]:
        args = self.forward.inputs(case)
        beyond = sorted(i for i in self.no_grad if i >= len(args))
        if beyond:
            raise UserCodeError("manifest (no_grad)", IndexError(
                f"no_grad names argument(s) {beyond}, but the inputs factory made {len(args)} argument(s) "
                f"(indices 0 to {len(args) - 1}); fix no_grad in {self.forward.repro_manifest}"))
        out = self.forward.run_reference(clone_tree(args))
        gen = torch.Generator().manual_seed(COTANGENT_SEED + case.seed)
        cotangents = []
        for _, t in flatten(out):
            if _float_tensor(t):
                c = torch.randn(t.shape, generator=gen, dtype=torch.float64)
                cotangents.append(c.to(dtype=t.dtype, device=t.device))
        self.layout.n_inputs = len(args)
        return tuple(args) + tuple(cotangents)


class BackwardSubject(Subject):
    """The backward pass of `forward` as a Subject (see the module docstring)."""

    def __init__(self, forward: Subject):
        layout = _Layout()
        with_params = shared_parameters(forward.raw_kernel_fn, forward.raw_reference_fn)
        no_grad = frozenset(forward.no_grad)
        super().__init__(forward.entry,
                         GradientOf(forward.raw_kernel_fn, "kernel", layout, with_params, no_grad),
                         GradientOf(forward.raw_reference_fn, "reference", layout, with_params, no_grad),
                         _CotangentFactory(forward, layout, no_grad), forward.device, forward.cases,
                         repro_manifest=forward.repro_manifest, oracle_device=forward.oracle_device,
                         judge_inplace=False)
        self.forward = forward
        self.layout = layout
        self.pristine_state = getattr(forward, "pristine_state", None)
        self._gradcheck_error: UserCodeError | None = None
        self._gradchecked = False

    def repro(self, gate: str, case: Case | None = None) -> str:
        """The command that judges this phase alone: `--gate NAME[backward]`."""
        return super().repro(gate.removesuffix(BACKWARD_SUFFIX) + BACKWARD_SUFFIX, case)

    def baseline(self, case: Case, max_elements: int | None = None):
        if not self._gradchecked:
            self._gradchecked = True
            self._gradcheck_error = self._gradcheck(case)
        if self._gradcheck_error is not None:
            raise self._gradcheck_error
        return super().baseline(case, max_elements)

    def _gradcheck(self, case: Case) -> UserCodeError | None:
        """The oracle is autograd of the reference in float64: check it against finite differences."""
        inputs = self.forward.inputs(case)
        device = self.oracle_device
        args = list(upcast(inputs, device))
        slots = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dtype == torch.float64
                 and i not in self.forward.no_grad]  # arguments declared no_grad stay fixed
        if not slots:
            return None
        fn = self.reference_fn._module_for(args)

        def as_function(*floats: torch.Tensor) -> tuple[torch.Tensor, ...]:
            full = list(args)
            for i, t in zip(slots, floats):
                full[i] = t
            return tuple(t for _, t in flatten(fn(*full)) if _float_tensor(t))

        floats = [args[i].detach().requires_grad_(True) for i in slots]
        try:
            ok = torch.autograd.gradcheck(as_function, floats, fast_mode=True, raise_exception=False,
                                          atol=1e-6, rtol=1e-4)
        except Exception as exc:  # noqa: BLE001 - a reference that autograd cannot differentiate
            return UserCodeError("reference (float64 autograd)", exc)
        if not ok:
            return UserCodeError("reference (float64 autograd)", RuntimeError(
                "torch.autograd.gradcheck: the reference's float64 gradients disagree with finite differences, "
                "so they cannot serve as the oracle; fix the reference's backward (custom autograd.Function?)"))
        return None
