"""contract: the output has the reference's structure, shape, dtype and device, is a plain
torch.Tensor (no subclass, no lazy wrapper) and does not alias an input where the reference's output
does not; its memory layout is one a caller of the reference can use (`layout_problem`), and, for a
kernel that declares `backward: true`, it requires grad where the reference's does. For `nn.Module` kernel and
reference, a call changes the module buffers both hold as the reference's call does (running statistics a
BatchNorm in training mode updates, counters by the same amount: `Contract.buffers_written`). Tolerance-free."""

from __future__ import annotations

from typing import Any

import torch

from kgate.compare import bitwise_mismatch, clone_tree, flatten, map_tensors, overlaps, structure
from kgate.gates.base import Gate, GateResult
from kgate.inputs import Case
from kgate.oracle import own_dtype
from kgate.subject import ModuleState, Subject, module_buffer_pairs, parameter_prints


def aliased_inputs(out: Any, args: tuple, skip: set[int]) -> dict[str, set[int]]:
    """Per output leaf path, the tensor arguments (by index, those in `skip` left out) it shares memory with."""
    found: dict[str, set[int]] = {}
    for path, leaf in flatten(out):
        if not isinstance(leaf, torch.Tensor):
            continue
        hits = {i for i, arg in enumerate(args)
                if i not in skip and isinstance(arg, torch.Tensor) and overlaps(leaf, arg)}
        if hits:
            found[path] = hits
    return found


def module_aliases(out: Any, module: torch.nn.Module) -> list[tuple[str, str]]:
    """(output leaf path, parameter or buffer name) for each output tensor that shares memory with the module's
    state (a view of an embedding table, the weight itself)."""
    held = [*module.named_parameters(), *module.named_buffers()]
    return [(path, n) for path, t in flatten(out) if isinstance(t, torch.Tensor) for n, p in held if overlaps(t, p)]


def module_alias_message(path: str, name: str) -> str:
    """The finding of an output that shares memory with the kernel module's `name` (`module_aliases`) where the
    reference's outputs share none with its own."""
    return (f"{path} shares memory with the kernel's {name!r} (a view of the module's state), where the reference's "
            "outputs share none with its own: a caller that writes to the output writes the module, and a later "
            "step of the module changes an output already returned")


def dense_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a tensor of `shape` and `strides` covers a block of memory exactly once (non-overlapping
    and dense: contiguous up to a permutation of its dimensions; dimensions of size 1 are free)."""
    if 0 in shape:
        return True
    expected = 1
    for size, stride in sorted(((n, st) for n, st in zip(shape, strides) if n != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def broadcast(t: torch.Tensor) -> bool:
    """Whether `t` overlaps itself the way an expanded (broadcast) tensor does: a stride 0 in a dimension of
    size > 1 (what torch itself reports as certain internal overlap)."""
    return any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride()))


def dimension_order(t: torch.Tensor) -> tuple[int, ...]:
    """The memory format of `t`: its dimensions of size > 1 from the outermost (largest stride) to the
    innermost. Row-major is (0, 1, ..., n-1); channels-last NCHW is (0, 2, 3, 1)."""
    dims = [d for d in range(t.dim()) if t.shape[d] != 1]
    return tuple(sorted(dims, key=lambda d: (-t.stride(d), d)))


def layout_problem(got: torch.Tensor, want: torch.Tensor) -> tuple[str, str, str] | None:
    """Why the kernel's output `got` is laid out where a caller of the reference breaks, as (message,
    expected, got), or None. The rule (torch.library.opcheck compares strides of dense outputs only and
    ignores dimensions of size 1; kgate compares the memory format those strides give):

    - an output that overlaps itself (an `expand`ed one: several elements at one address) only where the
      reference's does: writing into one element writes into others;
    - where the reference's output is dense and non-overlapping (contiguous, channels-last, any permutation),
      the kernel's has the same memory format: the same order of its dimensions (of size > 1) in memory,
      with unit stride where the reference's innermost dimension has it; or it is contiguous. A transposed or
      permuted result where the reference's is contiguous fails (`.view(-1)` raises on it, and code that
      hands its pointer on reads it in the wrong order). Row padding is accepted: a slice of a padded
      allocation (rows wider than the tensor), what tiled kernels return, keeps the order. A contiguous
      output is always accepted: every `view`/`reshape` that works on the reference's output works on it,
      and a dense reference output's strides are often an accident of its algorithm;
    - where the reference's output is not dense (a slice, a strided view), its strides belong to what it
      views, not to a promise about layout: nothing more is asked.
    Empty tensors have no layout."""
    if got.numel() == 0 or want.numel() == 0 or got.shape != want.shape:
        return None
    if broadcast(got) and not broadcast(want):
        return ("overlaps itself (several elements share one address; an expanded tensor), the reference's does "
                "not: writing into it writes into several elements", "non-overlapping memory",
                f"strides {tuple(got.stride())}")
    if not dense_strides(tuple(want.shape), tuple(want.stride())) or got.is_contiguous():
        return None
    order, wanted = dimension_order(got), dimension_order(want)
    # the reference's innermost dimension, those of size 1 included (stride ties go to the later one): where it
    # has size 1, the rows a padded allocation pads are one element wide, and no dimension needs unit stride
    inner = max(range(want.dim()), key=lambda d: (-want.stride(d), d)) if want.dim() else None
    if order != wanted or (wanted and wanted[-1] == inner and got.stride(wanted[-1]) != 1):
        return (f"has strides {tuple(got.stride())} (dimensions in memory, outermost first: {order}) where the "
                f"reference's output (dense) has {tuple(want.stride())} ({wanted}): code that works on the "
                "reference's output breaks on it (.view(-1) raises on a transposed/permuted result)",
                f"strides {tuple(want.stride())} (or padded rows of that order), or contiguous",
                f"strides {tuple(got.stride())}")
    return None


def _change(before: torch.Tensor, after: torch.Tensor) -> Any:
    """How one call changed a buffer: None (bitwise unchanged), ("adds", n) for an integer buffer every element of
    which moved by n (a counter), else "changes it"."""
    if bitwise_mismatch(before, after) is None:
        return None
    if not (before.dtype.is_floating_point or before.dtype.is_complex or before.dtype == torch.bool):
        steps = (after.long() - before.long()).unique()
        if steps.numel() == 1:
            return ("adds", int(steps.item()))
    return "changed"


def _moved(before: dict[str, tuple[float, float]], now: dict[str, tuple[float, float]]) -> list[str]:
    """The parameters whose prints (`parameter_prints`) differ (NaN prints equal: a NaN weight stays one)."""
    def same(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return all(x == y or (x != x and y != y) for x, y in zip(a, b))
    return [n for n, p in now.items() if n in before and not same(before[n], p)]


def _first_float_dtype(args: tuple) -> torch.dtype | None:
    return next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)


def _said(change: Any) -> str:
    if change is None:
        return "leaves it as it was"
    return f"adds {change[1]} to it" if isinstance(change, tuple) else "changes it"


def named_fields(obj: Any, path: str = "out") -> dict[str, tuple[str, ...] | None]:
    """Per tuple in an output tree (by the path `flatten` gives it), its field names if it is a named tuple
    (`torch.return_types.max`, a `collections.namedtuple`: `__match_args__`), else None."""
    found: dict[str, tuple[str, ...] | None] = {}
    if isinstance(obj, tuple):
        found[path] = getattr(type(obj), "__match_args__", None) or None
    if isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            found.update(named_fields(item, f"{path}[{i}]"))
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            found.update(named_fields(obj[key], f"{path}[{key!r}]"))
    return found


class Contract(Gate):
    name = "contract"
    summary = ("output matches the reference's structure, shape, dtype, device, layout (strides where dense); "
               "plain torch.Tensor; aliases inputs only as the reference does")
    tolerance_free = True

    def check(self, subject: Subject) -> GateResult:
        cases = subject.first_seed_cases()
        for case in cases:
            base = subject.baseline(case)
            args = clone_tree(base.args)
            out = subject.run_kernel(args)
            ref = base.reference
            if structure(out) != structure(ref):
                return self.failed(subject, "output structure differs from the reference's", case=case,
                                   expected=structure(ref), got=structure(out), where="out")
            # a named tuple is a tuple (structure() reads it by position), but where the reference returns one,
            # callers read its fields (`out.values`): the kernel's must have the same names
            kernel_fields = named_fields(out)
            for path, fields in named_fields(ref).items():
                if fields and kernel_fields.get(path) != fields:
                    got = f"named tuple ({', '.join(kernel_fields[path])})" if kernel_fields.get(path) else "a plain tuple"
                    return self.failed(subject, f"{path} is {got}; the reference's is a named tuple with fields "
                                       f"{', '.join(fields)} (callers that read {path}.{fields[0]} break)",
                                       case=case, expected=f"named tuple ({', '.join(fields)})", got=got, where=path)
            for (path, got), (_, want) in zip(flatten(out), flatten(ref)):
                if not isinstance(want, torch.Tensor):
                    continue
                if type(got) is not torch.Tensor:
                    return self.failed(subject, f"{path} is a {type(got).__module__}.{type(got).__qualname__}, "
                                       "not a plain torch.Tensor", case=case, expected="torch.Tensor",
                                       got=type(got).__qualname__, where=path)
                for attr in ("shape", "dtype", "device"):
                    a, b = getattr(want, attr), getattr(got, attr)
                    if attr == "shape":
                        a, b = tuple(a), tuple(b)
                    if a != b:
                        return self.failed(subject, f"{path} has {attr} {b}, the reference's has {a}", case=case,
                                           expected=str(a), got=str(b), where=path)
                problem = layout_problem(got, want)
                if problem:
                    message, expected, found = problem
                    return self.failed(subject, f"{path} {message}", case=case, expected=expected, got=found,
                                       where=path, details={"strides": list(got.stride()),
                                                            "reference_strides": list(want.stride())})
            aliased = aliased_inputs(out, args, subject.inplace)
            if not aliased:
                continue
            # Returning a view is part of some operators' meaning (reshape, transpose, slicing): an output
            # may share memory with the inputs its reference's output shares memory with, on its own copy
            # of the same inputs. The reference runs again only when the kernel's output aliases something.
            ref_args = clone_tree(base.args)
            allowed = aliased_inputs(subject.run_reference(ref_args), ref_args, subject.inplace)
            for path, hits in aliased.items():
                extra = sorted(hits - allowed.get(path, set()))
                if extra:
                    i = extra[0]
                    views = sorted(allowed.get(path, set()))
                    fresh = "a fresh tensor" + (f" or a view of argument {', '.join(map(str, views))}" if views else "")
                    return self.failed(subject, f"{path} aliases input argument {i} (shares its memory); "
                                       f"the reference's {path} does not alias it", case=case, expected=fresh,
                                       got=f"a view of argument {i}", where=path)
        grad = ""
        if cases and subject.backward and not hasattr(subject, "forward"):  # the forward phase of backward: true
            result = self.requires_grad(subject, cases[0])
            if result is not None:
                return result
            grad = ", requires_grad"
        buffers = ""
        if cases:
            result = self.module_state_kept(subject, cases[0])
            if result is not None:
                return result
            result, buffers = self.buffers_written(subject, cases)
            if result is not None:
                return result
        return self.passed(f"structure, shape, dtype, device, layout{grad} and aliasing as the reference in "
                           f"{len(cases)} case(s)" + (f"; {buffers}" if buffers else ""))

    def module_state_kept(self, subject: Subject, case: Case) -> GateResult | None:
        """An nn.Module kernel's parameters are its state, not its scratch space: one call of each on the case's
        inputs, and a parameter the kernel's call changes (bitwise: a gain folded into the weight in place, a
        weight transposed in place and back only on success) fails where the reference's call changes none of
        its own; and an output must not share memory with the kernel's parameters or buffers where the
        reference's shares none with its own (a view of an embedding table, written to by the caller, writes
        the weights). Everything put back after."""
        modules = subject.modules()
        if modules is None:
            return None
        kernel, reference = modules
        built = [subject.first_calls[role].parameters for role in ("kernel", "reference")]
        if built[0] is not None and built[1] is not None:  # since before the first calls (the standard test's)
            moved = [_moved(built[i], parameter_prints(m)) for i, m in enumerate(modules)]
            if moved[0] and not moved[1]:
                name = moved[0][0]
                return self.failed(subject, f"the kernel's parameter {name!r} holds other values than before its "
                                   "first call, where the reference's parameters hold theirs: a call changed the "
                                   "module's state (a fold made in place at the first call?); state_dict, optimizer "
                                   "steps and other modules sharing the weights see the change", case=case,
                                   expected="parameters as built", got=f"{name} changed", where=name)
        args = subject.baseline(case).args
        state = ModuleState(subject, modules)
        try:
            changed, shared = [], []
            saved = state.saved()  # (the bitwise copies it holds: no second copy of a model's weights)
            for module, run in ((reference, subject.run_reference), (kernel, subject.run_kernel)):
                out = run(clone_tree(args))
                changed.append([n for n, p in module.named_parameters()
                                if id(p) in saved and bitwise_mismatch(saved[id(p)], p.detach()) is not None])
                shared.append(module_aliases(out, module))
        finally:
            state.close()
        (ref_changed, kernel_changed), (ref_shared, kernel_shared) = changed, shared
        if kernel_changed and not ref_changed:
            name = kernel_changed[0]
            return self.failed(subject, f"the kernel's call changes its parameter {name!r} (bitwise), where the "
                               "reference's call changes none of its parameters: the module's state is not the "
                               "kernel's scratch space (state_dict, optimizer steps and other modules sharing the "
                               "weights see the change)", case=case, expected="parameters unchanged by a call",
                               got=f"{name} changed" + (f" (and {len(kernel_changed) - 1} more)"
                                                        if len(kernel_changed) > 1 else ""), where=name)
        if kernel_shared and not ref_shared:
            path, name = kernel_shared[0]
            return self.failed(subject, module_alias_message(path, name), case=case, expected="a fresh tensor",
                               got=f"a view of {name}", where=path)
        return None

    def buffers_written(self, subject: Subject, cases: list[Case]) -> tuple[GateResult | None, str]:
        """A module's state the call writes, as the reference writes it: of the buffers kernel and reference
        modules both hold (kgate.subject.pair_buffers: same name, shape and dtype, else the reference's order and
        values), one call of each must change the same ones (a
        BatchNorm in training mode updates its running statistics; a kernel that normalises with the batch's
        statistics and never updates them returns the right output, and the module computes with stale
        statistics once in eval mode), and an integer buffer (a step counter, `num_batches_tracked`) by the
        same amount. Float buffers are compared changed or not, not by value. Judged on a case whose inputs
        have the modules' own floating dtype (at another, the reference runs as a converted copy, whose buffers
        are not these). The modules' state is put back after. Returns (a failure or None, what was compared)."""
        modules = subject.modules()
        if modules is None:
            return None, ""
        kernel_own, reference_buffers = (dict(m.named_buffers()) for m in modules)
        # the kernel's buffers under the names of the reference's they stand for (by name, else by order and value)
        pairs = {r: k for k, r in module_buffer_pairs(*modules).items() if k in kernel_own}
        kernel_buffers = {r: kernel_own[k] for r, k in pairs.items()}
        shared = [n for n in reference_buffers if n in kernel_buffers]
        if not shared:
            return None, ""
        own = {own_dtype(m) for m in modules}
        case = next((c for c in cases if own == {_first_float_dtype(subject.baseline(c).args)}), None)
        if case is None:
            return None, "module buffers not compared (no case in the modules' own dtype)"
        args = subject.baseline(case).args
        state = ModuleState(subject, modules)
        subject.sync_buffers()  # (each call starts from the lockstep state: `before` is what it starts from)
        try:
            changes = []
            for run, buffers in ((subject.run_reference, reference_buffers), (subject.run_kernel, kernel_buffers)):
                before = {n: buffers[n].detach().clone() for n in shared}
                run(clone_tree(args))
                changes.append({n: _change(before[n], buffers[n].detach()) for n in shared})
        finally:
            state.close()
        reference, kernel = changes
        for name in shared:
            if reference[name] == kernel[name]:
                continue
            called = repr(name) if pairs[name] == name else f"{pairs[name]!r} (the reference's {name!r})"
            return self.failed(subject, f"the module's buffer {called}: the reference's call {_said(reference[name])}, "
                               f"the kernel's {_said(kernel[name])} (state a later call or eval mode reads: "
                               "running statistics, counters)", case=case, expected=_said(reference[name]),
                               got=_said(kernel[name]), where=pairs[name]), ""
        return None, f"{len(shared)} shared module buffer(s) written as the reference writes them"

    def requires_grad(self, subject: Subject, case: Case) -> GateResult | None:
        """A kernel that declares `backward: true` is called as training calls it: floating-point inputs that
        require grad, grad mode on. Each output must require grad exactly where the reference's does: an
        output that does not is cut from the graph (its inputs and parameters silently get no gradient).
        Arguments declared `no_grad` do not require grad, as training passes them."""
        base = subject.baseline(case)

        def leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
            return t.detach().clone().requires_grad_(grad and (t.is_floating_point() or t.is_complex()))

        def leaves() -> tuple:
            return tuple(map_tensors(arg, lambda t, grad=i not in subject.no_grad: leaf(t, grad))
                         for i, arg in enumerate(base.args))

        with torch.enable_grad():
            out = subject.run_kernel(leaves())
            ref = subject.run_reference(leaves(), grad=True)
        for (path, got), (_, want) in zip(flatten(out), flatten(ref)):
            if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) \
                    and got.requires_grad != want.requires_grad:
                why = ("gradients stop at it (no autograd.Function around the kernel?)" if want.requires_grad
                       else "the reference's does not")
                return self.failed(subject, f"{path} has requires_grad={got.requires_grad} with inputs that require "
                                   f"grad, the reference's has requires_grad={want.requires_grad}: {why}", case=case,
                                   expected=f"requires_grad={want.requires_grad}",
                                   got=f"requires_grad={got.requires_grad}", where=path)
        return None


GATE = Contract
