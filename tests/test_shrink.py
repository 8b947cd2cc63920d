"""kgate/shrink.py: shrinkers return a failing candidate that is locally minimal, within their budget."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kgate.shrink import CONTRACT, CRASH, ORACLE, judge_probe, numel, shrink_shape, shrink_subset
from tests.gate_harness import subject_for


def test_shape_shrinks_a_tail_bug_to_all_ones():
    shrunk = shrink_shape((7, 1000), lambda s: s[-1] % 128 != 0)
    assert shrunk.value == (1, 1) and shrunk.complete


def test_shape_bisects_to_the_first_size_past_a_block():
    shrunk = shrink_shape((3, 4097), lambda s: s[-1] > 1024)
    assert shrunk.value == (1, 1025)


def test_shape_keeps_an_empty_dimension_and_never_grows():
    seen = []

    def fails(shape):
        seen.append(shape)
        return shape[0] == 0

    shrunk = shrink_shape((0, 64, 9), fails)
    assert shrunk.value == (0, 1, 1)
    assert seen and all(s[0] == 0 and s[1] <= 64 and s[2] <= 9 for s in seen)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=3), st.integers(1, 5000))
def test_shape_result_fails_and_is_minimal_per_dimension(shape, threshold):
    def fails(s):
        return numel(s) >= threshold

    shape = tuple(shape)
    if not fails(shape):
        return
    shrunk = shrink_shape(shape, fails, budget=10_000)
    assert fails(shrunk.value) and numel(shrunk.value) <= numel(shape)
    for dim, size in enumerate(shrunk.value):  # monotone predicate: one less in any dimension passes
        if size > 1:
            assert not fails(shrunk.value[:dim] + (size - 1,) + shrunk.value[dim + 1:])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 80).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1,
                                                                             max_size=4))))
def test_subset_finds_exactly_the_needed_items(case):
    n, needed = case
    shrunk = shrink_subset(list(range(n)), lambda chosen: needed <= set(chosen), budget=10_000)
    assert sorted(shrunk.value) == sorted(needed) and shrunk.complete


def test_subset_respects_its_budget():
    calls = []
    shrunk = shrink_subset(list(range(1000)), lambda chosen: calls.append(1) or True, budget=5)
    assert len(calls) == 5 and not shrunk.complete and shrunk.value
    assert "budget spent" in shrunk.note()


def _ref(x):
    return x * 2


def _probe(kernel):
    subject = subject_for(kernel, _ref, lambda seed: (torch.arange(6, dtype=torch.float32),))
    args = subject.inputs(subject.cases[0])
    return judge_probe(subject, args, subject.run_reference(args), subject.oracle(args))


def test_judge_probe_tells_crash_contract_and_oracle_apart():
    finding, leaves = _probe(lambda x: x * 2)
    assert finding is None and len(leaves) == 1 and leaves[0].passed
    assert _probe(lambda x: 1 / 0)[0].kind == CRASH
    assert _probe(lambda x: (x * 2).double())[0].kind == CONTRACT
    assert _probe(lambda x: (x * 2)[:3])[0].kind == CONTRACT
    finding = _probe(lambda x: x * 2 + 1)[0]
    assert finding.kind == ORACLE and not finding.tolerance_free and "max abs error 1" in finding.message
