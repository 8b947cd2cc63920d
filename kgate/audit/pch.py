"""One precompiled `torch/extension.h` for all of an audit's `load_inline` builds (`kgate audit --pch`).

Every KernelBench CUDA candidate builds a `main.cpp` that includes `torch/extension.h`, the bulk of its
C++ compile time (measured here, one core: 21.6 s per build without a precompiled header, 7.6 s with
one). torch can precompile that header (`load_inline(..., use_pch=True)`) into its own include folder,
where GCC finds it for every later build whose flags match and silently ignores it otherwise. But torch
also deletes it on every build that does not ask for it, and rebuilds it on every build whose flags
differ: with many builds at once, one would delete or rewrite the file while others read it.

So the parent builds it once, with torch's own builder, before any build starts (`build`); each
worker then makes torch's two functions that build or delete it do nothing (`keep_shared`), before any
candidate code runs. Builds are unchanged (the same ninja file, the same flags): GCC decides per build
whether the header applies. Needs GCC; another compiler, an older torch without the builder, or a
read-only torch folder leave the audit as it was, with a line saying so.
"""

from __future__ import annotations

import time

_BUILDER = "_check_and_build_extension_h_precompiler_headers"
_REMOVER = "remove_extension_h_precompiler_headers"


def build() -> tuple[bool, str]:
    """Build (or keep, if current) torch's precompiled extension.h; returns (whether it is in place, a
    line for the log)."""
    from torch.utils import cpp_extension

    builder = getattr(cpp_extension, _BUILDER, None)
    if builder is None:
        return False, "--pch: this torch has no precompiled-header builder; building without it"
    start = time.perf_counter()
    try:
        builder([], [])
    except Exception as exc:  # noqa: BLE001 - any failure here only costs the speed-up
        return False, (f"--pch: could not precompile torch/extension.h ({type(exc).__name__}: {str(exc)[:300]}); "
                       "building without it")
    return True, f"--pch: torch/extension.h precompiled in {time.perf_counter() - start:.1f} s (kept if current)"


def keep_shared() -> None:
    """In a worker: torch neither rebuilds nor deletes the shared precompiled header."""
    from torch.utils import cpp_extension

    for name in (_BUILDER, _REMOVER):
        if hasattr(cpp_extension, name):
            setattr(cpp_extension, name, lambda *args, **kwargs: None)
