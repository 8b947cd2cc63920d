"""isolation: memoization, work after return, patching and non-plain results are caught; a plain
kernel passes."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from kgate.gates.isolation import Snapshot, lazy_problem
from tests.gate_harness import check


def rows(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn(shape or (5, 33), generator=gen, dtype=torch.float64) * 3).to(dtype),)


def ref(x):
    return torch.softmax(x, dim=-1)


def good(x):
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)


def run(kernel, **kw):
    return check("isolation", kernel, ref, rows, **kw)


def test_plain_kernel_passes():
    result = run(good)
    assert result.verdict == "pass", result.message
    assert "memoization probed in 1 case(s)" in result.message


def test_memo_keyed_on_address_fails():
    cache = {}

    def memo(x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in cache:
            cache[key] = good(x)
        return cache[key].clone()

    result = run(memo)
    assert result.verdict == "fail" and result.tolerance_free
    assert "memoized" in result.message and result.details["stale"] is True


def test_memo_keyed_on_address_version_and_a_sampled_value_fails():
    """A cache keyed on the address, the version counter and the first value: overwriting the inputs in place
    (which bumps the version) misses it; one other element changed through .data, as a kernel's own write
    leaves the version, does not."""
    cache = {}

    def memo(x):
        key = (x.data_ptr(), x._version, float(x.reshape(-1)[0]))
        if key not in cache:
            cache.clear()
            cache[key] = good(x)
        return cache[key]

    result = run(memo)
    assert result.verdict == "fail" and result.details.get("unversioned"), result.message
    assert "without a version bump" in result.message


def _top3(x):
    return torch.topk(x, 3, dim=-1).values


def _top3_rows(seed, shape=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(16, 64, generator=g).to(dtype),)


def test_memo_of_a_selection_keyed_on_its_end_values_fails():
    """A top-k cache keyed on the address and the first and last values: overwriting every value changes the
    key, and one element changed through .data at a random position rarely moves a top-3 (its truth stays,
    so nothing is stale there); the probe goes on to the largest and the smallest magnitudes, which move it."""
    cache = {}

    def memo(x):
        key = (x.data_ptr(), tuple(x.shape), float(x.reshape(-1)[0]), float(x.reshape(-1)[-1]))
        if key not in cache:
            cache.clear()
            cache[key] = _top3(x)
        return cache[key].clone()

    result = check("isolation", memo, _top3, _top3_rows)
    assert result.verdict == "fail" and result.details.get("unversioned"), result.message
    assert check("isolation", _top3, _top3, _top3_rows).verdict == "pass"


def test_unversioned_positions_are_a_seeded_one_then_the_extreme_magnitudes():
    from kgate.gates.isolation import unversioned_positions

    t = torch.tensor([[1.0, -9.0, 0.5], [float("nan"), 0.01, 2.0]])
    positions = unversioned_positions(t, torch.Generator().manual_seed(0))
    assert positions[0] != (0, 0) and (0, 1) in positions and (1, 1) in positions and (1, 0) not in positions[1:]
    assert len(positions) == len(set(positions)) <= 3


def nonnegative_ref(x):
    """A reference that declares its domain: it rejects negative inputs (see README, the reference's domain)."""
    if (x < 0).any():
        raise ValueError("x must be >= 0")
    return torch.sqrt(x)


def nonnegative_rows(seed, shape=None, dtype=torch.float32):
    return (rows(seed, shape, dtype)[0].abs(),)


def test_unversioned_change_outside_the_reference_domain_is_skipped_not_an_error():
    """The unversioned probe writes -2x into one element: a non-negative domain rejects it, and the probe is
    skipped rather than the gate reporting the reference's ValueError as an error."""
    result = check("isolation", torch.sqrt, nonnegative_ref, nonnegative_rows)
    assert result.verdict == "pass", result.message


def test_memo_still_fails_under_a_reference_with_a_domain():
    cache = {}

    def memo(x):
        key = (x.data_ptr(), x._version, float(x.reshape(-1)[0]))
        if key not in cache:
            cache.clear()
            cache[key] = torch.sqrt(x.abs())
        return cache[key]

    def bounded_ref(x):
        if (x.abs() > 1e3).any():
            raise ValueError("|x| must be <= 1e3")
        return torch.sqrt(x.abs())

    result = check("isolation", memo, bounded_ref, nonnegative_rows)
    assert result.verdict == "fail" and result.details.get("unversioned"), result.message


def test_memo_is_caught_even_when_declared_nondeterministic():
    cache = {}

    def memo(x):
        return cache.setdefault(x.data_ptr(), good(x)).clone()

    result = run(memo, nondeterministic=True)
    assert result.verdict == "fail" and "previous result again" in result.message


def test_reused_output_buffer_fails():
    buffers = {}

    def reuse(x):
        out = buffers.setdefault(tuple(x.shape), torch.empty_like(x))
        return torch.softmax(x, -1, out=out)

    result = run(reuse)
    assert result.verdict == "fail" and "buffer it reuses" in result.message


def _ring_kernel(size, copy_out=False):
    """Softmax into a ring of `size` preallocated buffers (a double/triple-buffering scheme)."""
    ring, turn = [], [0]

    def kernel(x):
        if len(ring) < size:
            ring.append(torch.empty_like(x))
        out = ring[turn[0] % len(ring)]
        turn[0] += 1
        torch.softmax(x, -1, out=out)
        return out.clone() if copy_out else out

    return kernel


@pytest.mark.parametrize("size", [3, 7])
def test_buffer_reused_every_few_calls_fails(size):
    result = run(_ring_kernel(size))
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert f"returned by call 1 was overwritten by call {size + 1}" in result.message
    assert result.details == {"overwritten_call": 1, "by_call": size + 1}


def test_ring_of_buffers_copied_out_passes():
    result = run(_ring_kernel(3, copy_out=True))
    assert result.verdict == "pass" and "outputs of 8 calls stay unchanged" in result.message


def test_work_finished_on_a_thread_after_return_fails():
    def side_thread(x):
        out = torch.empty_like(x)

        def work():
            time.sleep(0.05)
            out.copy_(good(x))

        threading.Thread(target=work, name="late-writer").start()
        return out

    result = run(side_thread)
    assert result.verdict == "fail" and "still being written after the kernel returned" in result.message
    assert result.details["threads"] == ["late-writer"]


def _head_start_kernel(wait_s):
    """Fills the output on a worker thread and waits for it at most `wait_s` (None: until it is done); the
    work itself takes microseconds, so the bounded wait is always long enough on an idle machine."""

    def kernel(x):
        out = torch.empty_like(x)
        worker = threading.Thread(target=lambda: torch.softmax(x, -1, out=out), name="head-start")
        worker.start()
        worker.join(wait_s)
        return out

    return kernel


def test_thread_with_a_bounded_head_start_fails():
    result = run(_head_start_kernel(0.1))
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert "still being written after the kernel returned" in result.message
    assert "1 thread(s) it started, still running at return (head-start)" in result.message
    assert "held 0.5 s before running" in result.message and result.details["threads"] == ["head-start"]


# the rejected-call probe's int64 input makes the kernel's thread raise (softmax has no int64 kernel)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_thread_waited_for_without_bound_passes():
    assert run(_head_start_kernel(None)).verdict == "pass"


def _pooled_kernel(wait_s):
    """A softmax handed to a thread pool whose worker an earlier call started (idle between calls), waited for
    at most `wait_s` (None: until done)."""
    from concurrent.futures import ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool")

    def kernel(x):
        out = torch.zeros_like(x)

        def work():
            out.copy_(good(x))

        wait([pool.submit(work)], timeout=wait_s)
        return out

    return kernel


def test_bounded_wait_on_a_pool_an_earlier_call_started_fails():
    from kgate.gates.isolation import install_thread_gate

    install_thread_gate()  # as the workers do before loading the kernel's code
    kernel = _pooled_kernel(0.05)
    kernel(torch.zeros(2, 3))  # the pool's worker starts here, before the gate's calls
    result = run(kernel)
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert "started by an earlier call, held in this one" in result.message


def test_unbounded_wait_on_a_pool_an_earlier_call_started_passes():
    from kgate.gates.isolation import install_thread_gate

    install_thread_gate()
    kernel = _pooled_kernel(None)
    kernel(torch.zeros(2, 3))
    assert run(kernel).verdict == "pass"


def test_child_processes_lists_a_running_child():
    import subprocess
    import sys

    from kgate.gates.isolation import child_processes

    before = child_processes()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child_processes() - before == {child.pid}
    finally:
        child.kill()
        child.wait()
    assert child.pid not in child_processes()


def test_a_thread_that_finishes_before_return_is_fine():
    def joined(x):
        out = torch.empty_like(x)
        t = threading.Thread(target=lambda: out.copy_(good(x)))
        t.start()
        t.join()
        return out

    assert run(joined).verdict == "pass"


@pytest.mark.parametrize(("target", "attr"), [(torch, "softmax"), (torch.Tensor, "sum"), (time, "perf_counter")])
def test_patching_torch_or_timers_fails(target, attr):
    original = getattr(target, attr)

    def patcher(x):
        setattr(target, attr, lambda *a, **k: original(*a, **k))
        return good(x)

    try:
        result = run(patcher)
    finally:
        setattr(target, attr, original)
    assert result.verdict == "fail" and f"{attr} was replaced" in result.message


def test_flipping_a_numerics_flag_fails():
    before = torch.get_float32_matmul_precision()

    def tf32(x):
        torch.set_float32_matmul_precision("medium")
        return good(x)

    try:
        result = run(tf32)
    finally:
        torch.set_float32_matmul_precision(before)
    assert result.verdict == "fail" and "get_float32_matmul_precision" in result.message


def _flush_denormals(x):
    torch.set_flush_denormal(True)  # subnormal arithmetic is slow on x86: flush it, for every later caller too
    return good(x)


def _grad_off(x):
    torch.set_grad_enabled(False)
    return good(x)


def _autocast_on(x):
    torch.set_autocast_enabled("cpu", True)
    return good(x)


def _restore_process_state():
    torch.set_flush_denormal(False)
    torch.set_grad_enabled(True)
    torch.set_autocast_enabled("cpu", False)


@pytest.mark.parametrize(("kernel", "words"), [
    (_flush_denormals, "floating-point environment: flush-to-zero (subnormal results become 0) changed from "
                       "False to True"),
    (_grad_off, "torch.is_grad_enabled() changed from True to False"),
    (_autocast_on, "torch.is_autocast_enabled('cpu') changed from False to True")],
    ids=["flush-denormal", "grad-mode", "autocast"])
def test_process_numerics_state_left_changed_fails(kernel, words):
    if kernel is _flush_denormals and not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero mode torch can set")
    try:
        result = run(kernel)
    finally:
        _restore_process_state()
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert words in result.message and result.expected == "unchanged since before this gate's calls"
    assert "--gate isolation" in result.repro


def test_process_numerics_state_changed_and_restored_passes():
    def scoped(x):
        with torch.autocast("cpu", enabled=False), torch.no_grad():  # both restored on exit
            return good(x)

    assert run(scoped).verdict == "pass"


def test_state_set_from_the_inputs_dtype_fails_through_the_float64_call():
    def follows_input(x):  # a no-op at float32: only inputs of another dtype leave the default changed
        torch.set_default_dtype(x.dtype)
        return good(x)

    try:
        result = run(follows_input)
    finally:
        torch.set_default_dtype(torch.float32)
    assert result.verdict == "fail", result.message
    assert "torch.get_default_dtype() changed from torch.float32 to torch.float64" in result.message


def test_a_setting_pinned_to_the_value_the_process_has_fails_through_the_moved_call():
    """torch.set_num_threads(1) in a process that has one thread already changes nothing the before/after
    comparison sees; moved to 2 before one call, the setting comes back as 1 (the catalogue's controls)."""
    from tests.gate_harness import catalogue

    ic, iv = catalogue("isolation", "correct"), catalogue("isolation", "violating")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pinned, restored = (check("isolation", k, ic.reference, ic.make_inputs)
                            for k in (iv.softmax_pins_one_thread, ic.softmax_one_thread_restored))
        assert torch.get_num_threads() == 1, "the gate must put the moved setting back"
    finally:
        torch.set_num_threads(threads)
    assert pinned.verdict == "fail" and pinned.tolerance_free, pinned.message
    assert "sets torch.get_num_threads() to 1" in pinned.message and pinned.where == "torch.get_num_threads()"
    assert restored.verdict == "pass", restored.message


def test_kernel_refusing_float64_passes():
    def float32_only(x):
        if x.dtype != torch.float32:
            raise TypeError("float32 only")
        return good(x)

    result = run(float32_only)
    assert result.verdict == "pass", result.message


def test_floating_point_environment_reads_both_modes():
    from kgate.gates.isolation import floating_point_environment

    assert not any(floating_point_environment().values())
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode torch can set")
    try:
        assert all(floating_point_environment().values())  # torch sets FTZ and DAZ together on x86
    finally:
        torch.set_flush_denormal(False)


def test_patching_the_reference_module_fails():
    import types

    module = types.ModuleType("fake_reference_module")
    exec("import torch\ndef helper(x):\n    return torch.softmax(x, -1)\ndef reference(x):\n    return helper(x)\n",
         module.__dict__)
    import sys

    sys.modules[module.__name__] = module
    try:
        def patcher(x):
            module.helper = lambda t: good(t)
            return good(x)

        result = check("isolation", patcher, module.reference, rows)
    finally:
        del sys.modules[module.__name__]
    assert result.verdict == "fail" and "reference module fake_reference_module.helper" in result.message


def test_pristine_snapshot_catches_import_time_patches():
    from tests.gate_harness import subject_for

    pristine = Snapshot.take(ref)
    original = torch.allclose
    torch.allclose = lambda *a, **k: True  # what a kernel module might do when imported
    try:
        subject = subject_for(good, ref, rows)
        subject.pristine_state = pristine
        from kgate import gates as registry

        result = registry.get("isolation").check(subject)
    finally:
        torch.allclose = original
    assert result.verdict == "fail" and "torch.allclose was replaced" in result.message
    assert "before the kernel's module was imported" in result.expected


class Deferred(torch.Tensor):
    pass


@pytest.mark.parametrize(("make", "words"), [
    (lambda x: good(x).as_subclass(Deferred), "torch.Tensor subclass"),
    (lambda x: good(x).to(torch.complex64).conj(), "conjugate"),
])
def test_non_plain_results_fail(make, words):
    reference = ref if "subclass" in words else (lambda x: good(x).to(torch.complex64).conj().resolve_conj())
    result = check("isolation", make, reference, rows)
    assert result.verdict == "fail" and words in result.message


def test_lazy_problem_accepts_plain_tensors():
    assert lazy_problem(torch.zeros(2)) is None
    assert "meta" in lazy_problem(torch.zeros(2, device="meta"))


def test_a_launch_fault_surfacing_in_the_early_copies_is_the_kernels(monkeypatch):
    """On a GPU, a kernel launch that fails at once ("invalid argument") is reported by the next CUDA call;
    in this gate that is kgate's copy of the outputs, read before any sync. It is the kernel's error, not
    a kgate internal error (seen on the H200 audit)."""
    from kgate.gates import isolation
    from kgate.subject import UserCodeError

    armed = [False]
    real_clone = torch.Tensor.clone

    def clone(self, *args, **kwargs):
        if armed[0]:
            armed[0] = False
            raise RuntimeError("CUDA error: invalid argument")
        return real_clone(self, *args, **kwargs)

    def faulty(x):
        out = good(x)
        armed[0] = True
        return out

    monkeypatch.setattr(torch.Tensor, "clone", clone)
    from tests.gate_harness import subject_for

    subject = subject_for(faulty, ref, rows)
    with pytest.raises(UserCodeError) as caught:
        isolation.Isolation().plain_and_settled(subject, subject.cases[0])
    assert caught.value.role == "kernel" and "invalid argument" in str(caught.value)


# --- a stale result is one off by more than the oracle bound -------------------------------------------

def _one_large_and_equal_small(small):
    """float16 [1024, small x 9]: the unversioned probe changes one element other than the first (a small one,
    whichever it draws) to -2x, so the sum moves by 3 x small whatever the position."""
    def make(seed, shape=None, dtype=torch.float16):
        return (torch.tensor([1024.0] + [small] * 9, dtype=torch.float16),)
    return make


def _sum_truncated(x):
    """The sum in float32, rounded to float16 toward zero: within an ulp of the truth (inside the bound)."""
    total = x.float().sum()
    out = total.half()
    return torch.where(out.float().abs() > total.abs(), torch.nextafter(out, torch.zeros_like(out)), out)


def test_a_kernel_within_the_bound_need_not_move_with_a_one_ulp_move_of_the_rounded_truth():
    """The sum moves by 0.2 (an ulp of 1024 is 1) across a rounding boundary: the oracle rounded to float16 moves
    from 1025 to 1024, the truncating kernel stays at 1024, within the bound both times. Not stale."""
    make = _one_large_and_equal_small(0.0667)
    (x,) = make(0)
    changed = x.clone()
    changed[1] = -2 * changed[1]
    assert x.double().sum().half() != changed.double().sum().half()  # the rounded truth moves by an ulp
    assert torch.equal(_sum_truncated(x), _sum_truncated(changed))  # the kernel does not
    result = check("isolation", _sum_truncated, lambda x: x.sum(), make, dtypes=["float16"])
    assert result.verdict == "pass", result.message


def test_a_sampled_memo_whose_previous_result_is_off_by_more_than_the_bound_still_fails():
    """The same inputs with small elements of 30: the change (90) is far beyond the bound (about 4 ulps of 1024)."""
    cache = {}

    def memo(x):
        key = (x.data_ptr(), x._version, float(x.reshape(-1)[0]))
        if key not in cache:
            cache.clear()
            cache[key] = x.sum()
        return cache[key]

    result = check("isolation", memo, lambda x: x.sum(), _one_large_and_equal_small(30.0), dtypes=["float16"])
    assert result.verdict == "fail" and result.details.get("unversioned"), result.message
    assert "which is now off by 90 at out[] (bound " in result.message
    assert "--gate isolation" in result.repro


def test_a_kernel_already_off_before_the_change_is_not_called_stale():
    """A sum rounded to a multiple of 100 (1000 for 1024.6: off by more than the bound before the change as after
    it) returns the same 1000 after the probe's change: the oracle gate's finding, not a stale result."""
    def sum_to_hundreds(x):
        return (x.float().sum() / 100).round().mul(100).to(x.dtype)

    make = _one_large_and_equal_small(0.0667)
    assert check("oracle", sum_to_hundreds, lambda x: x.sum(), make, dtypes=["float16"]).verdict == "fail"
    result = check("isolation", sum_to_hundreds, lambda x: x.sum(), make, dtypes=["float16"])
    assert result.verdict == "pass", result.message


# --- random generators ----------------------------------------------------------------------------------------

def _softmax_rows_in_random_order(x):
    """Right values whatever the order; the order drawn from torch's global generator."""
    order = torch.randperm(x.shape[0])
    out = torch.empty_like(x)
    out[order] = torch.softmax(x[order], dim=-1)
    return out


def _softmax_sampled_telemetry(x):
    """Right values; Python's global random decides whether to log (it draws on every call)."""
    import random

    if random.random() < 0.01:
        pass  # (a log line would go here)
    return torch.softmax(x, dim=-1)


def test_a_kernel_drawing_from_a_global_generator_the_reference_leaves_alone_fails():
    """Values right and bitwise deterministic, but the caller's random stream moved on: isolation fails, naming the
    generator."""
    softmax = lambda x: torch.softmax(x, dim=-1)  # noqa: E731
    for kernel, name in ((_softmax_rows_in_random_order, "torch's CPU generator"),
                         (_softmax_sampled_telemetry, "Python's random module")):
        result = check("isolation", kernel, softmax, rows)
        assert result.verdict == "fail" and f"the kernel draws from {name}" in result.message, result.message
        assert check("determinism", kernel, softmax, rows).verdict == "pass"


def test_the_random_streams_probe_puts_the_generators_back():
    import random

    from kgate.gates.isolation import RandomStreams

    streams = RandomStreams(torch.device("cpu"))
    saved = streams.take()
    torch.rand(3)
    random.random()
    moved = streams.take()
    assert not all(streams.same(moved[k], saved[k]) for k in saved)
    streams.put(saved)
    assert all(streams.same(streams.take()[k], saved[k]) for k in saved)


def test_a_private_generator_or_a_reference_that_draws_too_passes():
    """A generator of the kernel's own leaves the caller's streams alone; where the reference draws from the global
    generator itself (dropout in training), the kernel may too."""
    private = torch.Generator().manual_seed(0)

    def rows_in_private_order(x):
        order = torch.randperm(x.shape[0], generator=private)
        out = torch.empty_like(x)
        out[order] = torch.softmax(x[order], dim=-1)
        return out

    def drawing_reference(x):
        torch.rand(1)  # draws, as the kernel does
        return torch.softmax(x, dim=-1)

    assert check("isolation", rows_in_private_order, lambda x: torch.softmax(x, dim=-1), rows).verdict == "pass"
    assert check("isolation", _softmax_rows_in_random_order, drawing_reference, rows).verdict == "pass"


# --- state after a rejected call ------------------------------------------------------------------------------

def _features(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (5, 12), generator=gen, dtype=torch.float64).to(dtype),)


class _SquareLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.weight = torch.nn.Parameter(torch.randn(12, 12, generator=gen) / 12 ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(12, generator=gen))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight, self.bias)


class _SwappedLayout(_SquareLinear):
    """Swaps weight.data to its transposed view for addmm and back after; with `restore`, in a finally block."""

    def __init__(self, restore):
        super().__init__()
        self.restore = restore

    def forward(self, x):
        w = self.weight
        w.data = w.data.t()
        try:
            y = torch.addmm(self.bias, x, w)
        except Exception:
            if self.restore:
                w.data = w.data.t()
            raise
        w.data = w.data.t()
        return y


def test_state_left_changed_by_a_raised_call_fails():
    """An input of the wrong width (the reference rejects it) makes addmm raise between the swaps: the weight
    stays transposed, and the next call on the inputs of before multiplies by W, not W^T."""
    result = check("isolation", _SwappedLayout(restore=False), _SquareLinear(), _features)
    assert result.verdict == "fail" and result.tolerance_free, result.message
    assert "after a call on inputs the reference rejects (argument 0: last dimension narrowed from 12 to 11" in \
        result.message
    assert "the kernel raised RuntimeError" in result.message and "weight (strides (12, 1) -> (1, 12); values " \
        "changed)" in result.message and "bitwise" in result.message
    assert result.details["rejected_variant"].startswith("argument 0: last dimension narrowed")
    assert "--gate isolation" in result.repro


def test_a_raised_call_that_leaves_a_parameter_of_another_shape_fails_and_the_parameter_is_put_back():
    """Not square: the weight left transposed makes the next call on the inputs of before raise. The probe puts
    the module's parameters back after, a tensor whose data a call replaced with another shape included."""

    class Narrow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(3)
            self.weight = torch.nn.Parameter(torch.randn(7, 12, generator=gen))
            self.bias = torch.nn.Parameter(torch.randn(7, generator=gen))

        def forward(self, x):
            return torch.nn.functional.linear(x, self.weight, self.bias)

    class NarrowSwapped(Narrow):
        forward = _SwappedLayout.forward
        restore = False

    kernel = NarrowSwapped()
    result = check("isolation", kernel, Narrow(), _features)
    assert result.verdict == "fail" and result.details["raised"] is True, result.message
    assert "weight (shape (7, 12) -> (12, 7))" in result.message
    assert kernel.weight.shape == (7, 12) and kernel.weight.stride() == (12, 1)


def test_state_restored_in_finally_after_a_raised_call_passes():
    result = check("isolation", _SwappedLayout(restore=True), _SquareLinear(), _features)
    assert result.verdict == "pass", result.message
    assert "state unchanged after a call on inputs the reference rejects (argument 0: last dimension narrowed " \
        "from 12 to 11 (shape (5, 11)); the kernel raised RuntimeError" in result.message


def test_no_variant_the_reference_rejects_skips_the_rejected_call_probe_saying_so():
    double = lambda x: x * 2  # noqa: E731 - any width, any dtype
    result = check("isolation", double, double, rows)
    assert result.verdict == "pass", result.message
    assert "state after a rejected call not probed (the reference accepts each variant of the inputs tried: " \
        "argument 0: last dimension narrowed from 33 to 32" in result.message


def test_off_the_cpu_with_index_inputs_no_argument_is_narrowed_only_retyped_or_widened():
    """Class targets in range of the logits' width are out of range of them narrowed: a kernel that gathers with
    them on a GPU asserts on the device and loses the context, where the reference raises on the shape."""
    from kgate.gates.isolation import rejected_variants

    args = (torch.randn(4, 10), torch.randint(0, 10, (4,)))
    assert [w for _, w in rejected_variants(args)][0].startswith("argument 0: last dimension narrowed")
    kept = [w for _, w in rejected_variants(args, narrow=False)]
    assert kept == ["argument 0: dtype int64, its values truncated to integers, shape unchanged",
                    "argument 0: last dimension widened from 10 to 11 (shape (4, 11), its last column repeated)"]


class _Scaled(torch.nn.Module):
    """x * scale, `scale` a persistent buffer the calls do not write."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 33))

    def forward(self, x):
        return x * self.scale


class _ScaledInverted(_Scaled):
    """Inverts its buffer in place to divide by it, and inverts it back after (no try/finally): an input of
    another width raises in between."""

    def forward(self, x):
        self.scale.reciprocal_()
        y = x / self.scale
        self.scale.reciprocal_()
        return y


def test_a_buffer_left_changed_by_a_raised_call_is_not_hidden_by_the_lockstep():
    """The lockstep sets the kernel's buffers to the reference's before every call; where the reference's calls
    write none, the probe's calls start from the buffers as the raised call left them."""
    result = check("isolation", _ScaledInverted(), _Scaled(), rows)
    assert result.verdict == "fail" and "the kernel raised RuntimeError" in result.message, result.message
    assert check("isolation", _Scaled(), _Scaled(), rows).verdict == "pass"


def test_boundaries_refilled_in_place_show_a_schedule_cached_by_address():
    """Another seed's ragged batch has another row count (not written into the same tensors), and a permutation
    leaves the boundaries unsorted (the reference rejects them): the memoization probe moves the sorted integer
    argument's boundaries in place (same length and ends), which a schedule keyed on its address misses."""
    from tests.gate_harness import catalogue

    dc, ic, iv = catalogue("distributions", "correct"), catalogue("isolation", "correct"), catalogue("isolation", "violating")
    bad = check("isolation", iv.segment_sums_schedule_by_address, dc.segment_sums_reference, dc.make_ragged)
    assert bad.verdict == "fail" and "boundaries moved" in bad.message, bad.message
    good = check("isolation", ic.segment_sums_schedule_by_value, dc.segment_sums_reference, dc.make_ragged)
    assert good.verdict == "pass" and "memoization probed" in good.message, good.message
