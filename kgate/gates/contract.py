"""contract: the output has the reference's structure, shape, dtype and device, is a plain
torch.Tensor (no subclass, no lazy wrapper) and does not alias an input where the reference's output
does not. Tolerance-free."""

from __future__ import annotations

from typing import Any

import torch

from kgate.compare import clone_tree, flatten, overlaps, structure
from kgate.gates.base import Gate, GateResult
from kgate.subject import Subject


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
    summary = ("output matches the reference's structure, shape, dtype, device; plain torch.Tensor; "
               "aliases inputs only as the reference does")
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
        return self.passed(f"structure, shape, dtype, device and aliasing as the reference in {len(cases)} case(s)")


GATE = Contract
