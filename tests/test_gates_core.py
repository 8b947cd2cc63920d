"""The first five gates: each must fail a kernel that violates it and pass a correct one."""

from __future__ import annotations

import math

import pytest
import torch

from kgate import gates as registry
from kgate import procmem
from kgate.subject import UserCodeError
from tests.domain_support import decayed_keys, decayed_keys_reference, keys_and_gates
from tests.gate_harness import check


def rows(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.randn(shape or (5, 33), generator=gen, dtype=torch.float64) * 3).to(dtype),)


def ref_softmax(x):
    return torch.softmax(x, dim=-1)


def good_softmax(x):
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)


SHAPES = [[1, 16], [5, 33]]


def run(gate, kernel, **kw):
    kw.setdefault("shapes", SHAPES)
    return check(gate, kernel, ref_softmax, rows, **kw)


@pytest.mark.parametrize("gate", ["contract", "oracle", "special_values", "determinism", "input_integrity"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_correct_kernel_passes(gate, dtype):
    result = run(gate, good_softmax, dtypes=[dtype], seeds=[0, 1])
    assert result.verdict == "pass", result.message


# --- contract ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kernel", "words"), [
    (lambda x: good_softmax(x).squeeze(), "has shape"),
    (lambda x: good_softmax(x).double(), "has dtype"),
    (lambda x: (good_softmax(x),), "structure"),
    (lambda x: x.copy_(good_softmax(x)), "aliases input argument 0"),
    (lambda x: good_softmax(x).as_subclass(type("Lazy", (torch.Tensor,), {})), "not a plain torch.Tensor"),
])
def test_contract_fails(kernel, words):
    result = run("contract", kernel)
    assert result.verdict == "fail" and words in result.message
    assert result.tolerance_free and result.broken
    assert result.repro.startswith("kgate run kgate.yaml -k k --gate contract --device cpu --seed 0")


def test_contract_allows_declared_inplace_output():
    assert run("contract", lambda x: x.copy_(good_softmax(x)), inplace=[0]).verdict == "pass"


# --- oracle ------------------------------------------------------------------------------------------

def fp16_sum_softmax(x):
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    acc = torch.zeros(x.shape[:-1] + (1,), dtype=torch.float16)
    for j in range(x.shape[-1]):
        acc += z[..., j:j + 1].to(torch.float16)
    return z / acc.to(x.dtype)


def test_oracle_fails_low_precision_accumulation():
    result = run("oracle", fp16_sum_softmax)
    assert result.verdict == "fail"
    assert "max abs error" in result.message and "bound" in result.message
    assert result.where.startswith("out[") and result.case["dtype"] == "float32"
    assert result.evidence and all({"err", "ref_err", "floor", "bound"} <= set(e) for e in result.evidence)


def test_oracle_fails_off_by_one_ulp_scaled_bias():
    result = run("oracle", lambda x: good_softmax(x) * (1 + 1e-4))
    assert result.verdict == "fail" and result.details["ratio"] > 1


def test_oracle_broken_flag_only_far_beyond_bound():
    result = run("oracle", lambda x: good_softmax(x) + 0.1)
    assert result.verdict == "fail" and result.broken


def test_measure_leaves_its_tensors_alone():
    """measure() computes in place on its own temporaries only: in float64 the oracle, the reference and
    the kernel's output can be the very tensors the baseline cache holds (or one and the same)."""
    from kgate.oracle import measure

    oracle = torch.tensor([1.0, -2.0, math.nan, 4.0], dtype=torch.float64)
    kernel = torch.tensor([1.5, -2.0, 3.0, math.inf], dtype=torch.float64)
    before = (oracle.clone(), kernel.clone())
    leaf = measure(kernel, oracle, oracle, path="out", factor=8, ulps=4, atol=0)
    assert torch.equal(oracle.nan_to_num(), before[0].nan_to_num()) and torch.equal(kernel, before[1])
    assert leaf.err == math.inf and leaf.index == [3] and leaf.ref_err == 0.0
    leaf = measure(kernel[:2], None, oracle[:2], path="out", factor=8, ulps=4, atol=0)
    assert leaf.err == 0.5 and leaf.expected == 1.0 and leaf.got == 1.5 and leaf.rel_err == 0.5


def test_oracle_reference_error_is_calibrated_per_dtype():
    # A float16 kernel computing in float32 inside is within the bound; the same error in float32 is not.
    def half_ok(x):
        return good_softmax(x.float()).to(x.dtype)

    assert run("oracle", half_ok, dtypes=["float16"]).verdict == "pass"
    assert run("oracle", lambda x: good_softmax(x.half()).float()).verdict == "fail"


def test_oracle_integer_outputs_exact():
    def ref(x):
        return x.argmax(dim=-1)

    assert check("oracle", lambda x: x.argmax(dim=-1), ref, rows).verdict == "pass"
    result = check("oracle", lambda x: x.argmin(dim=-1), ref, rows)
    assert result.verdict == "fail" and "exact match required" in result.message


# --- special_values ----------------------------------------------------------------------------------

def test_special_values_fails_nan_masking():
    result = run("special_values", lambda x: torch.nan_to_num(torch.softmax(x, -1)))
    assert result.verdict == "fail" and result.expected == "NaN" and "injected" in result.message


def test_special_values_fails_overflow():
    def naive(x):
        z = torch.exp(x)
        return z / z.sum(dim=-1, keepdim=True)

    result = run("special_values", naive, shapes=[[4, 8]])
    assert result.verdict == "fail"


def test_special_values_fails_inf_clamping():
    result = run("special_values", lambda x: torch.softmax(x.clamp(-1e4, 1e4), -1))
    assert result.verdict == "fail"


def test_special_values_skips_integer_inputs():
    def ints(seed):
        return (torch.arange(6),)

    assert check("special_values", lambda x: x * 2, lambda x: x * 2, ints).verdict == "skip"


# --- determinism -------------------------------------------------------------------------------------

def racy_sum(x):
    perm = torch.randperm(x.shape[-1])
    total = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for block in perm.split(4):
        total = total + x[..., block].sum(dim=-1)
    return total


def test_determinism_fails_order_dependent_sum():
    result = check("determinism", racy_sum, lambda x: x.sum(-1), rows, shapes=[[3, 4097]])
    assert result.verdict == "fail" and "differs from call 1" in result.message and result.tolerance_free


def test_determinism_fails_address_dependent_output():
    result = run("determinism", lambda x: good_softmax(x) * (1 + (x.data_ptr() % 1_000_003) * 1e-9))
    assert result.verdict == "fail"


def test_determinism_fails_only_what_the_reference_holds():
    """A kernel that inherits the reference's own run-to-run differences is not blamed for them: the gate
    skips and names both; a racy kernel beside a deterministic reference fails and says so."""
    inherited = check("determinism", racy_sum, racy_sum, rows, shapes=[[3, 4097]])
    assert inherited.verdict == "skip", inherited.message
    assert "the reference called the same way differs too" in inherited.message
    assert "the kernel's call 2 differs from call 1" in inherited.message
    blamed = check("determinism", racy_sum, lambda x: x.sum(-1), rows, shapes=[[3, 4097]])
    assert blamed.verdict == "fail" and "the reference called the same way is bitwise equal" in blamed.message


class _NowAndThen:
    """A cumsum whose last element moves by one ulp on every 7th call of the process (one counter for kernel and
    reference, both this code): an operator that differs only now and then, as torch's CUDA cumsum, whose scan
    combines the blocks' partial sums in the order they finish."""
    calls = 0

    def __call__(self, x):
        _NowAndThen.calls += 1
        out = x.cumsum(-1)
        if _NowAndThen.calls % 7 == 0:
            out[..., -1] = torch.nextafter(out[..., -1], torch.tensor(float("inf"), dtype=out.dtype))
        return out


def test_determinism_gives_a_reference_that_differs_now_and_then_rounds_to_show_it():
    """The kernel is the reference's own code: where the kernel's calls differ and the reference's first round of
    calls happens not to, the reference gets more rounds and shows the same differences (skip, not fail). Beside
    a deterministic reference the same kernel fails, naming the reference's calls."""
    for start in range(7):  # wherever the kernel's difference falls in the reference's calls
        _NowAndThen.calls = start
        result = check("determinism", _NowAndThen(), _NowAndThen(), rows, shapes=[[3, 64]])
        assert result.verdict != "fail", (start, result.message)
    blamed = check("determinism", _NowAndThen(), lambda x: x.cumsum(-1), rows, shapes=[[3, 64]])
    assert blamed.verdict == "fail" and "bitwise equal (30 calls, 10 round(s) of 3)" in blamed.message, blamed.message


def test_determinism_fails_a_result_that_follows_generators_seeded_alike_on_every_call():
    """As a KernelBench pair's models are called (kgate.oracle.seeded: the same seed on every call), a random
    completion order repeats from call to call; at other generator states it does not, and the reference's
    result never depended on them."""
    from kgate.oracle import seeded

    def pinned(fn):
        def call(x):
            with seeded(0):
                return fn(x)
        return call

    result = check("determinism", pinned(racy_sum), pinned(lambda x: x.sum(-1)), rows, shapes=[[3, 4097]])
    assert result.verdict == "fail", result.message
    assert "with torch's random generators at another state" in result.message


def test_determinism_passes_a_kernel_drawing_what_the_reference_draws():
    from kgate.oracle import seeded

    def noisy(x):  # draws from the generators, as the reference does: kernel and reference agree on every seed
        with seeded(0):
            return x + torch.randn(x.shape, dtype=x.dtype)

    result = check("determinism", noisy, noisy, rows)
    assert result.verdict == "pass", result.message
    assert "where the reference's result depends on them too" in result.message


class _Autotuned:
    """A softmax whose first call runs another block size (another summation order) than every later one, as
    an autotuner that returns the result of whichever config it timed first."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        block = 7 if self.calls == 1 else 32
        z = torch.exp(x - x.amax(dim=-1, keepdim=True))
        total = sum(z[..., j:j + block].sum(dim=-1, keepdim=True) for j in range(0, z.shape[-1], block))
        return z / total


def _after_a_first_call(kernel):
    """The determinism gate on `kernel` after one call of kernel and reference before any gate (as the audit's
    standard test makes them), on inputs of another seed than the gate's."""
    from kgate import gates as registry
    from kgate.inputs import Case
    from tests.gate_harness import subject_for

    subject = subject_for(kernel, ref_softmax, rows)
    first = subject.inputs(Case(None, "float32", 12345))
    subject.run_reference(first)
    subject.run_kernel(first)
    return registry.get("determinism").check(subject)


def test_determinism_fails_a_first_call_that_computes_otherwise():
    result = _after_a_first_call(_Autotuned())
    assert result.verdict == "fail", result.message
    assert "first call in the process differs from the same call made later" in result.message


def test_determinism_passes_a_first_call_that_only_warms_up():
    cache = {}

    def warmed(x):  # the first call fills a cache of the same values every later call computes
        cache.setdefault("shift", None)
        return good_softmax(x)

    result = _after_a_first_call(warmed)
    assert result.verdict == "pass" and "call(s) in the process made again after" in result.message


class _TunedFirstWins:
    """Times one block size a call on its first three calls and keeps the first: the first call and every
    call from the fourth on sum alike; the second and third do not (the red-team candidate
    softmax__autotune_first_calls, caught or missed by its timings until kgate kept more than the first)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        block = (32, 7, 5)[self.calls - 1] if self.calls <= 3 else 32
        z = torch.exp(x - x.amax(dim=-1, keepdim=True))
        return z / sum(z[..., j:j + block].sum(dim=-1, keepdim=True) for j in range(0, z.shape[-1], block))


def test_determinism_fails_an_autotuner_whose_winner_is_its_first_config():
    from kgate import gates as registry
    from kgate.inputs import Case
    from tests.gate_harness import subject_for

    subject = subject_for(_TunedFirstWins(), ref_softmax, rows)
    for seed in (101, 102, 103, 104, 105):  # the standard test's trials, before any gate
        trial = subject.inputs(Case(None, "float32", seed))
        subject.run_reference(trial)
        subject.run_kernel(trial)
    result = registry.get("determinism").check(subject)
    assert result.verdict == "fail", result.message
    assert "call number 2 in the process differs from the same call made later" in result.message


class _CommitsAfter:
    """Softmax summed in blocks of 32 for its first `warmup` calls, in blocks of 7 after."""

    def __init__(self, warmup):
        self.calls, self.warmup = 0, warmup

    def __call__(self, x):
        self.calls += 1
        block = 32 if self.calls <= self.warmup else 7
        z = torch.exp(x - x.amax(dim=-1, keepdim=True))
        return z / sum(z[..., j:j + block].sum(dim=-1, keepdim=True) for j in range(0, z.shape[-1], block))


def test_determinism_fails_a_kernel_that_commits_to_another_computation_after_a_warmup_count(monkeypatch):
    from kgate.gates import determinism

    result = _after_a_first_call(_CommitsAfter(100))
    assert result.verdict == "fail" and result.details["soaked"] == determinism.SOAK_CALLS, result.message
    monkeypatch.setattr(determinism, "SOAK_CALLS", 0)  # without the soak, its first call is made again too early
    assert _after_a_first_call(_CommitsAfter(100)).verdict == "pass"


def test_determinism_keeps_no_call_that_raised_as_a_first_call():
    """A first call that raised is not paired with the next call's outputs (a false first-call failure)."""
    from kgate import gates as registry
    from kgate.inputs import Case
    from kgate.subject import UserCodeError
    from tests.gate_harness import subject_for

    calls = []

    def raises_once(x):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first call fails")
        return good_softmax(x)

    subject = subject_for(raises_once, ref_softmax, rows)
    with pytest.raises(UserCodeError):
        subject.run_kernel(subject.inputs(Case(None, "float32", 7)))
    subject.run_reference(subject.inputs(Case(None, "float32", 8)))
    subject.run_kernel(subject.inputs(Case(None, "float32", 8)))
    result = registry.get("determinism").check(subject)
    assert result.verdict == "pass", result.message


def test_determinism_skips_when_declared():
    assert check("determinism", racy_sum, lambda x: x.sum(-1), rows, nondeterministic=True).verdict == "skip"


# --- input_integrity ---------------------------------------------------------------------------------

def inplace_softmax(x):
    x.sub_(x.amax(dim=-1, keepdim=True)).exp_()
    return x / x.sum(dim=-1, keepdim=True)


def test_input_integrity_fails_inplace_mutation():
    result = run("input_integrity", inplace_softmax)
    assert result.verdict == "fail" and "modified in place" in result.message and result.where.startswith("args[0]")


def test_input_integrity_fails_single_nan_scribble():
    def scribble(x):
        out = good_softmax(x)
        x.view(-1)[-1] = math.nan
        return out

    result = run("input_integrity", scribble)
    assert result.verdict == "fail" and "1 of" in result.message


@pytest.mark.parametrize(("sanitise", "words"), [
    (lambda x: x.masked_fill_(x == 0, 0.0), "negative zeros and subnormals"),
    (lambda x: x.nan_to_num_(), "NaNs with a payload and infinities")], ids=["signed-zero", "nan-to-num"])
def test_input_integrity_fails_a_sanitising_pass_only_special_inputs_show(sanitise, words):
    def kernel(x):  # on random normal inputs the pass changes nothing
        sanitise(x)
        return good_softmax(x)

    result = run("input_integrity", kernel)
    assert result.verdict == "fail" and words in result.message, result.message


def test_input_integrity_passes_a_kernel_reading_special_inputs():
    result = run("input_integrity", lambda x: good_softmax(torch.nan_to_num(x)))
    assert result.verdict == "pass" and "probe(s) whose inputs hold negative zeros" in result.message, result.message


def test_input_integrity_fails_metadata_change():
    def resize(x):
        out = good_softmax(x)
        x.resize_(x.numel())
        return out

    assert "shape or strides" in run("input_integrity", resize).message


def test_input_integrity_respects_declared_inplace():
    assert run("input_integrity", inplace_softmax, inplace=[0]).verdict == "skip"


# --- user code errors --------------------------------------------------------------------------------

def test_kernel_exception_is_attributed_to_the_kernel():
    def broken(x):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(UserCodeError) as info:
        run("oracle", broken)
    assert info.value.role == "kernel"


def qk(seed, shape=None):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=gen), torch.randn(8, 6, generator=gen)


def test_special_values_exact_class_distinguishes_nan_from_inf():
    def infs(seed):
        q, k = qk(seed)
        return q, k

    result = check("special_values", lambda q, k: torch.where(torch.isinf(q @ k), math.nan, q @ k),
                   lambda q, k: q @ k, infs)
    assert result.verdict == "fail" and result.expected in ("+Inf", "-Inf") and "NaN" in result.got


def test_special_values_nonfinite_match_accepts_nan_for_inf_but_not_masking():
    nan_for_inf = lambda q, k: torch.where(torch.isinf(q @ k), math.nan, q @ k)  # noqa: E731
    assert check("special_values", nan_for_inf, lambda q, k: q @ k, qk,
                 special_values_match="nonfinite").verdict == "pass"
    masked = lambda q, k: torch.nan_to_num(q @ k, nan=0.0, posinf=0.0, neginf=0.0)  # noqa: E731
    result = check("special_values", masked, lambda q, k: q @ k, qk, special_values_match="nonfinite")
    assert result.verdict == "fail" and result.expected == "non-finite" and result.got.startswith("finite")


# --- special_values: probes the reference rejects (its declared domain) ---------------------------------

def test_special_values_skips_probes_the_reference_rejects_and_still_judges_the_rest():
    result = check("special_values", decayed_keys, decayed_keys_reference, keys_and_gates)
    assert result.verdict == "pass", result.message
    # +-Inf keys and a +Inf gate are outside the domain; so are scaled keys (the overflow probe is
    # then retried one argument at a time: the gate alone is inside). The keys get 7 positions, the gates 6
    # (their two seeded draws coincide): NaN keys and NaN and -Inf gates are judged, 7 + 6 + 6 probes, and
    # the gate scaled alone. The whole lines: the keys' NaN lines along each of 3 dimensions and NaN in all
    # of them are judged (4), their +-Inf lines along the 3 rejected (6); the gates' NaN and -Inf lines along
    # both dimensions and all NaN judged (5), their +Inf lines rejected (2). The two subnormal probes, like the
    # overflow probe, judge the gate scaled alone and skip the keys scaled: 20 + 9 + 2 judged, 21 + 8 + 2
    # skipped.
    assert "NaN/Inf pattern matched the oracle in 31 probe(s)" in result.message
    assert "skipped 31 the reference rejects: +Inf injected into argument 0 at [3, 15, 7] (last element)" \
        in result.message
    assert "argument 0 scaled to overflow-prone magnitudes" in result.message


def test_special_values_on_a_domain_still_fails_nan_masking():
    result = check("special_values", lambda k, g: torch.nan_to_num(decayed_keys(k, g)), decayed_keys_reference,
                   keys_and_gates)
    assert result.verdict == "fail" and result.expected == "NaN" and "NaN injected into argument 0" in result.message


def test_special_values_kernel_raising_on_a_probe_the_reference_accepts_is_not_skipped():
    def asserts_finite(k, g):
        if not torch.isfinite(k).all():
            raise ValueError("non-finite key")
        return decayed_keys(k, g)

    with pytest.raises(UserCodeError) as info:
        check("special_values", asserts_finite, decayed_keys_reference, keys_and_gates)
    assert info.value.role == "kernel"


def test_special_values_skipped_when_the_reference_rejects_every_probe():
    def bounded(x):
        # NaN and Inf fail the comparisons too; a row must reach magnitude 1 (subnormal rows do not)
        if not ((x.abs() <= 10).all() and (x.abs().amax(-1) >= 1).all()):
            raise ValueError("inputs must be finite and within [-10, 10], each row reaching magnitude 1")
        return torch.softmax(x, -1)

    result = check("special_values", good_softmax, bounded, rows)
    # 6 positions (the first seeded draw is the last element) x NaN, +Inf, -Inf, the overflow probe, the
    # whole lines (NaN, +Inf and -Inf along both dimensions, NaN in all: 7) and the two subnormal probes; no
    # line the reference does not read (it raises: no gradient)
    assert result.verdict == "skip" and "the reference rejects every probe (28:" in result.message


# --- special_values_match: spread ----------------------------------------------------------------------

CHUNK = 8


def chunked_cumsum(x):
    """A chunked scan: in-chunk prefix sums by a masked matmul (0 * NaN = NaN reaches the whole chunk,
    also the positions before the injected value), plus the carried sums of the earlier chunks."""
    xc = x.reshape(*x.shape[:-1], -1, CHUNK)
    local = xc @ torch.triu(torch.ones(CHUNK, CHUNK, dtype=x.dtype))
    carry = local[..., -1].cumsum(-1) - local[..., -1]
    return (local + carry.unsqueeze(-1)).reshape(x.shape)


def scan(kernel, **kw):
    return check("special_values", kernel, lambda x: torch.cumsum(x, -1), rows, shapes=[[4, 32]], **kw)


def test_spread_allows_injected_values_to_reach_more_of_a_chunk_and_counts_them():
    result = scan(chunked_cumsum, special_values_match="spread")
    assert result.verdict == "pass", result.message
    assert "allowed by special_values_match: spread" in result.message and "NaN spread to " in result.message
    spread = result.details["spread"]
    assert spread and all(s["outputs"] > 0 and s["injected"] in ("NaN", "+Inf", "-Inf") for s in spread)
    assert f"NaN spread to {sum(s['outputs'] for s in spread if s['injected'] == 'NaN')}," in result.message


@pytest.mark.parametrize("mode", ["exact", "nonfinite"])
def test_spread_of_an_injected_value_fails_without_the_declaration(mode):
    result = scan(chunked_cumsum, special_values_match=mode)
    assert result.verdict == "fail" and "injected" in result.message


def test_spread_still_needs_non_finite_where_the_oracle_is():
    result = scan(lambda x: torch.nan_to_num(chunked_cumsum(x), nan=0.0, posinf=0.0, neginf=0.0),
                  special_values_match="spread")
    assert result.verdict == "fail" and result.expected == "non-finite" and result.got.startswith("finite")


def test_spread_does_not_excuse_overflow_on_the_overflow_probe():
    def squares_then_sum(x):  # x * x overflows float16 where the norm does not
        return torch.sqrt((x * x).sum(-1))

    def norm(x):
        return torch.linalg.vector_norm(x, dim=-1)

    kw = {"shapes": [[4, 512]], "dtypes": ["float16"]}
    result = check("special_values", squares_then_sum, norm, rows, special_values_match="spread", **kw)
    assert result.verdict == "fail" and "overflow-prone" in result.message
    assert result.expected == "finite" and result.got.startswith("non-finite")
    assert check("special_values", norm, norm, rows, special_values_match="spread", **kw).verdict == "pass"


def _upper_triangular_pair(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(12, 12, generator=g).triu(), torch.rand(12, 12, generator=g).triu())


def _triangular_subject(kernel, declared=True):
    from tests.gate_harness import subject_for

    subject = subject_for(kernel, lambda a, b: torch.triu(a @ b), _upper_triangular_pair)
    subject.conform = lambda original, probe: (probe[0].triu(), probe[1].triu())
    subject.structural_zeros = lambda args: declared
    return subject


def _skips_the_zero_halves(a, b):
    """out[i, j] = sum over i <= k <= j of a[i, k] b[k, j]: the products with a's or b's declared zeros are
    never formed (so 0 * NaN never happens), as a triangular matmul kernel does."""
    n = a.shape[0]
    i, k, j = torch.meshgrid(torch.arange(n), torch.arange(n), torch.arange(n), indexing="ij")
    inside = (i <= k) & (k <= j)
    return torch.where(inside, a[:, :, None] * b[None, :, :], torch.zeros(())).sum(dim=1)


def test_special_values_allow_a_kernel_to_skip_the_declared_zeros_of_structured_inputs():
    """KernelBench's triangular matmul: a NaN injected into B[k, j] reaches out[i, j] (i > k) in the oracle
    only as A[i, k] * NaN with A[i, k] a declared zero. A kernel that skips the zero half gives a finite
    number there; that is allowed (and counted) where the problem's inputs declare the structure, not
    elsewhere, and a kernel that drops a NaN it did multiply still fails."""
    gate = registry.get("special_values")
    passed = gate.check(_triangular_subject(_skips_the_zero_halves))
    assert passed.verdict == "pass", passed.message
    assert "declared zero" in passed.message and passed.details["structural"]
    undeclared = gate.check(_triangular_subject(_skips_the_zero_halves, declared=False))
    assert undeclared.verdict == "fail" and "the oracle gives NaN" in undeclared.message

    def drops_nan(a, b):
        return torch.nan_to_num(_skips_the_zero_halves(a, b), nan=0.0, posinf=0.0, neginf=0.0)

    dropped = gate.check(_triangular_subject(drops_nan))
    assert dropped.verdict == "fail", dropped.message
    # the masks' two extra oracle calls per probe are made only where some class differs
    counts = []
    for declared in (True, False):
        faithful = _triangular_subject(lambda a, b: torch.triu(a @ b), declared)
        calls, real = [], faithful.oracle
        faithful.oracle = lambda args, calls=calls, real=real: calls.append(1) or real(args)
        assert gate.check(faithful).verdict == "pass"
        counts.append(len(calls))
    # (structured inputs get no +-Inf lines across their first dimension: 2 inputs x 2 values fewer probes)
    assert counts[0] + 4 == counts[1] and counts[0] > 0


def _oom_on_the_device(calls):
    def reference(x):
        calls.append(x.device.type)
        if x.device.type != "cpu":
            raise RuntimeError("CUDA out of memory. Tried to allocate 16.00 GiB")
        return x * 2

    return reference


def test_the_oracle_falls_back_to_the_cpu_when_the_host_can_hold_it(monkeypatch):
    from kgate import subject as subject_module
    from tests.gate_harness import subject_for

    calls = []
    subject = subject_for(lambda x: x * 2, _oom_on_the_device(calls), lambda case, device: (torch.ones(4, 4),))
    subject.oracle_device = torch.device("meta")
    monkeypatch.setattr(subject_module, "HOST_MEMORY", None)
    out = subject.oracle((torch.ones(4, 4),))
    assert calls == ["meta", "cpu"] and out.dtype == torch.float64 and torch.equal(out, torch.full((4, 4), 2.0,
                                                                                                  dtype=torch.float64))


def test_the_oracle_keeps_the_devices_out_of_memory_error_when_the_host_cannot_hold_it(monkeypatch):
    from kgate import subject as subject_module
    from tests.gate_harness import subject_for

    calls = []
    subject = subject_for(lambda x: x * 2, _oom_on_the_device(calls), lambda case, device: (torch.ones(4, 4),))
    subject.oracle_device = torch.device("meta")
    # room for the process as it is and 100 bytes more: a float64 copy of 16 elements (x3) needs 384
    monkeypatch.setattr(subject_module, "HOST_MEMORY", procmem.resident() + 100)
    with pytest.raises(UserCodeError, match="CUDA out of memory"):
        subject.oracle((torch.ones(4, 4),))
    assert calls == ["meta"]
    monkeypatch.setattr(subject_module, "HOST_MEMORY", procmem.resident() + 2**30)
    assert subject_module.host_can_hold((torch.ones(4, 4),))


def test_the_oracle_counts_the_references_output_before_falling_back_to_the_cpu(monkeypatch):
    """An operator whose output is far larger than its inputs (a transposed convolution, an outer
    product): counting the inputs alone sent a 17 GiB float64 output to the CPU and past the worker's
    host memory limit. The reference's output at the same input shapes is counted too."""
    from kgate import subject as subject_module
    from tests.gate_harness import subject_for

    calls = []

    def outer(x):
        calls.append(x.device.type)
        if x.device.type != "cpu":
            raise RuntimeError("CUDA out of memory. Tried to allocate 16.00 GiB")
        return x[:, None] * x[None, :]  # 256 inputs -> 65,536 outputs

    subject = subject_for(lambda x: x, outer, lambda case, device: (torch.ones(256),))
    subject.oracle_device = torch.device("meta")
    # room for the inputs in float64 three times over (6 KiB) and 64 KiB more, not for the outputs (1.5 MiB)
    monkeypatch.setattr(subject_module, "HOST_MEMORY", procmem.resident() + 70 * 2**10)
    x = torch.ones(256)
    assert subject_module.host_can_hold((x,))  # inputs alone: it would fall back
    subject.run_reference((x,))  # the reference at these shapes: 65,536 output elements
    calls.clear()
    with pytest.raises(UserCodeError, match="CUDA out of memory"):
        subject.oracle((x,))
    assert calls == ["meta"]  # the device's error stands (an audit judges it again with the whole GPU)
    monkeypatch.setattr(subject_module, "HOST_MEMORY", procmem.resident() + 2**30)
    assert subject.oracle((x,)).shape == (256, 256) and calls == ["meta", "meta", "cpu"]


def test_the_oracle_counts_a_module_references_weights_before_moving_to_the_cpu(monkeypatch):
    """A module reference that lives on the device gets a float64 copy of its weights on the host when its
    oracle moves there (a device's refusal, special_values' evaluation on the CPU): a model of billions of
    parameters would take the worker past its host limit, so its weights count with the inputs."""
    from kgate import subject as subject_module
    from tests.gate_harness import subject_for

    class OnTheDevice(torch.nn.Module):
        def __init__(self, device):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(1000, 1000, device=device))

        def forward(self, x):
            return x * 2

    x = (torch.ones(4),)
    on_device = subject_for(lambda x: x * 2, OnTheDevice("meta"), lambda case, device: x)
    on_host = subject_for(lambda x: x * 2, OnTheDevice("cpu"), lambda case, device: x)
    assert on_device._host_elements(x) == 1000 * 1000 and on_host._host_elements(x) == 0
    # room for the inputs and 1 MiB more, not for 10^6 weights in float64 (x3: 24 MB)
    monkeypatch.setattr(subject_module, "HOST_MEMORY", procmem.resident() + 2**20)
    assert subject_module.host_can_hold(x) and not subject_module.host_can_hold(x, on_device._host_elements(x))
    on_device.oracle_device = torch.device("meta")
    assert on_device.oracle_on_cpu(x) is None  # not asked: the host cannot hold it


# --- in-place kernels that return nothing --------------------------------------------------------------

def _add_into(a, b):
    a.add_(b)


def _pairs(seed, shape=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    shape = shape or (4, 16)
    return (torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))


@pytest.mark.parametrize("gate", ["oracle", "special_values", "shapes", "distributions"])
def test_an_inplace_kernel_that_returns_nothing_is_judged_on_what_it_writes(gate):
    """A reference that gives its result only in an argument declared in-place (`a.add_(b)`, returning
    None): before, no gate had an output to compare, and a kernel writing garbage there passed them all."""
    def garbage(a, b):
        a.mul_(7)

    shapes = [[4, 16], [7, 100]]
    wrong = check(gate, garbage, _add_into, _pairs, shapes=shapes, inplace=[0])
    assert wrong.verdict == "fail", wrong.message
    def right(a, b):
        a.copy_(a + b)

    right = check(gate, right, _add_into, _pairs, shapes=shapes, inplace=[0])
    assert right.verdict == "pass", right.message


def test_a_module_reference_gets_a_float64_oracle():
    """A manifest may name nn.Module instances: the float64 oracle ran the module's float32 parameters on
    float64 inputs and raised in every gate (dtype mismatch)."""
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh())
    good = check("oracle", reference, reference, rows, shapes=SHAPES[:1])
    assert good.verdict == "pass", good.message

    def loose(x):
        return reference(x) * (1 + 1e-3)

    bad = check("oracle", loose, reference, rows, shapes=SHAPES[:1])
    assert bad.verdict == "fail", bad.message


# --- mixed precision: float16 inputs, a float32 reduction -------------------------------------------------

def _half_rows(seed, shape=None, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    return ((torch.rand(shape or (8, 1024), generator=gen) + 0.5).to(torch.float16),)


def _sum_in_float32(x):  # the reference: float16 values, summed and returned in float32
    return x.sum(-1, dtype=torch.float32)


def _half_running_total(x):  # blocks summed in float32, the running total kept in float16
    total = torch.zeros(x.shape[0], dtype=torch.float16)
    for j in range(0, x.shape[1], 64):
        total = total + x[:, j:j + 64].float().sum(-1).half()
    return total.float()


def _float_running_total(x):
    total = torch.zeros(x.shape[0], dtype=torch.float32)
    for j in range(0, x.shape[1], 64):
        total = total + x[:, j:j + 64].float().sum(-1)
    return total


def test_a_float16_running_total_fails_where_the_reference_sums_in_float32():
    """The bound is taken in what the reference returns (float32), not in its inputs' dtype: a total rounded to
    float16 on the way misses it by orders of magnitude."""
    result = check("oracle", _half_running_total, _sum_in_float32, _half_rows, dtypes=["float16"])
    assert result.verdict == "fail", result.message
    assert "floor" in result.message and result.details.get("ratio", 100) > 10


def test_a_float32_running_total_passes_where_the_reference_sums_in_float32():
    result = check("oracle", _float_running_total, _sum_in_float32, _half_rows, dtypes=["float16"])
    assert result.verdict == "pass", result.message


def test_determinism_calls_see_their_inputs_aligned_first_and_unaligned_after_on_every_allocator():
    """A path chosen by address (a wide path for 128-byte aligned operands) is seen only if one call gets
    aligned operands and another does not. The CPU's allocator aligns at 64 bytes, sometimes at 128: the
    first call's copies used to land where they fell, so every call could take the same path."""
    import torch

    from kgate.gates.determinism import ALIGN_BYTES, OFFSET_BYTES, at_offset

    for n in range(1, 40):
        for dtype in (torch.float32, torch.float16, torch.float64, torch.int8):
            x = torch.arange(n, dtype=torch.float64).to(dtype)
            for offset in OFFSET_BYTES:
                (copy,) = at_offset((x,), offset)
                assert torch.equal(copy, x)
                assert copy.data_ptr() % ALIGN_BYTES == offset // x.element_size() * x.element_size(), (n, dtype)


def test_bitwise_differ_tells_each_pair_as_bitwise_mismatch_does_with_one_read():
    from kgate.compare import bitwise_differ, bitwise_mismatch

    base = torch.randn(5, 3)
    nan = torch.tensor([float("nan"), 1.0])
    other_nan = nan.view(torch.int32).clone()
    other_nan[0] += 1  # another NaN payload: bitwise different, numerically "equal"
    pairs = [(base, base.clone()),                                    # equal
             (base, base.clone().index_fill_(0, torch.tensor([4]), 7.0)),  # one row differs
             (torch.tensor([0.0]), torch.tensor([-0.0])),             # the sign of zero
             (nan, nan.clone()), (nan, other_nan.view(torch.float32)),
             (base, base.double()), (base, base[:4]),                 # dtype, shape
             (torch.empty(0, 3), torch.empty(0, 3)),                  # empty
             (torch.tensor([1 + 2j]), torch.tensor([1 - 2j])),        # complex
             (torch.tensor([True, False]), torch.tensor([True, False])),
             (torch.arange(4, dtype=torch.int64), torch.arange(4, dtype=torch.int64).flip(0))]
    expected = [False, True, True, False, True, True, True, False, True, False, True]
    assert [bitwise_mismatch(a, b) is not None for a, b in pairs] == expected
    for together in (None, True, False):  # (by device: pair by pair on the CPU; all at once, as on a GPU)
        assert bitwise_differ(pairs, together=together) == expected
        assert bitwise_differ([], together=together) == []


def test_a_module_kept_in_lockstep_gets_every_differing_buffer_and_keeps_the_equal_ones_untouched():
    from kgate.subject import Lockstep

    kernel, reference = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
    lock = Lockstep(kernel, reference)
    kernel(torch.randn(8, 4))  # moves the kernel's running statistics and its counter
    before = kernel.running_var._version
    kernel.running_var.copy_(reference.running_var)  # (equal again: left alone by the load below)
    version = kernel.running_var._version
    assert version > before
    lock.before_kernel()
    for name, t in kernel.named_buffers():
        assert torch.equal(t, dict(reference.named_buffers())[name]), name
    assert kernel.running_var._version == version  # equal: not written
    # the float64 copy of the reference gets the state in its own dtype, converted once per state tensor
    wide = torch.nn.BatchNorm1d(4).double()
    wide.running_mean.fill_(3.0)
    lock.load(wide)
    assert wide.running_mean.dtype == torch.float64 and torch.equal(wide.running_mean, reference.running_mean.double())
    assert len(lock._conversions) == sum(1 for t in lock.state.values() if t.is_floating_point())


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))

    def forward(self, x):
        return self.block(x)


@pytest.mark.parametrize("change", ["buffer replaced", "submodule replaced", "data swapped", "state adopted",
                                    "buffer added", "none"])
def test_a_lockstep_load_repeated_after_a_change_of_what_the_module_holds_loads_the_state_there(change):
    """Lockstep keeps what a load found (where each buffer is, its address, the state's value for it) for the next
    load of the same module: every change of those is seen, and the state is loaded where the module holds it now."""
    from kgate.subject import Lockstep

    kernel, reference = _Net(), _Net()
    kernel.load_state_dict(reference.state_dict())
    reference.train()(torch.randn(8, 4))  # the state: moved running statistics, a counter at 1
    lock = Lockstep(kernel, reference)
    lock.adopt()
    lock.before_kernel()
    plans = dict(lock._plans)
    bn = kernel.block[1]
    if change == "buffer replaced":
        bn.running_mean = torch.full((4,), 7.0)
    elif change == "submodule replaced":
        kernel.block[1] = torch.nn.BatchNorm1d(4)
    elif change == "data swapped":
        bn.running_var.data = torch.full((4,), 9.0)
    elif change == "state adopted":
        reference.train()(torch.randn(8, 4) * 3)
        lock.adopt()
    elif change == "buffer added":
        bn.running_mean = None  # (a BatchNorm without running statistics, then with them again)
        lock.before_kernel()
        bn.running_mean = torch.full((4,), 5.0)
    else:
        bn.running_mean.fill_(2.0)  # in place: the same tensor, at the same address
    lock.before_kernel()
    for name, t in kernel.named_buffers():
        assert torch.equal(t, lock.state[name]), (change, name)
    if change == "none":
        assert lock._plans == plans  # the plan of the first load served again
    elif change != "buffer added":
        assert all(lock._plans[k] is not plans[k] for k in plans), change


def test_a_lockstep_load_plan_of_a_module_gone_is_dropped_with_the_next_plan():
    """A plan holds its module's buffers: a converted copy made anew must not stay held through its old plan."""
    import gc
    import weakref

    from kgate.subject import Lockstep

    kernel, reference = _Net(), _Net()
    lock = Lockstep(kernel, reference)
    first = _Net().double()
    lock.load(first)
    held = weakref.ref(first.block[1].running_mean)
    del first
    gc.collect()
    second = _Net().double()
    lock.load(second)  # the next copy's first load
    gc.collect()
    assert held() is None
    assert lock._plans and all(p.module() is second for p in lock._plans.values())


def test_a_gate_is_profiled_into_the_workers_log_only_when_asked(monkeypatch, capsys):
    from kgate.worker import PROFILE_ENV, _profiled

    def work() -> int:
        return sum(i * i for i in range(20000))

    for value in (None, "0", "many"):
        if value is None:
            monkeypatch.delenv(PROFILE_ENV, raising=False)
        else:
            monkeypatch.setenv(PROFILE_ENV, value)
        with _profiled("oracle"):
            work()
        assert capsys.readouterr().err == ""
    monkeypatch.setenv(PROFILE_ENV, "5")
    with _profiled("oracle"):
        work()
    err = capsys.readouterr().err
    assert "gate oracle, the 5 functions of most tottime" in err and "of most cumulative" in err
    assert "<genexpr>" in err  # the function that took the time is named


def test_a_buffer_is_found_along_its_name_as_the_module_holds_it_now():
    from kgate.subject import _held

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.BatchNorm1d(3)))
    named = dict(model.named_buffers())
    assert all(_held(model, n) is t for n, t in named.items()) and len(named) == 3
    assert _held(model, "0.weight", parameter=True) is model[0].weight and _held(model, "0.weight") is None
    assert _held(model, "1.0.missing") is None and _held(model, "2.0.running_mean") is None
    model[1][0].running_mean = torch.ones(3)  # a buffer replaced: the new one
    assert _held(model, "1.0.running_mean") is model[1][0].running_mean
    model[1][0] = torch.nn.BatchNorm1d(3)  # a submodule replaced: the new one's
    assert _held(model, "1.0.running_var") is model[1][0].running_var
