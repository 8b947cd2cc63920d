"""Property: whatever document the loader is given (generated YAML, or bytes), it answers a manifest or a
ManifestError (exit 2); any other exception is a traceback a user would see."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgate.errors import ManifestError
from kgate.manifest import load

KEYS = ["version", "defaults", "kernels", "name", "kernel", "reference", "inputs", "shapes", "dtypes", "gates",
        "include", "exclude", "seeds", "tolerance", "factor", "ulps", "atol", "limits", "memory", "timeout",
        "inplace", "no_grad", "kwargs", "resources", "max_registers", "spills", "format", "problems", "candidates",
        "expect", "device", "shape", "dtype", "value", "x-base"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(KEYS),
    st.sampled_from(["k.py:f", "all", "float16", "8GiB", "-5", "1e12", "../..", "/abs", "oracle", "kernelbench",
                     "cuda:0", "", "*x", "::error::x", "\x00", "a" * 300]),
    st.text(max_size=20),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(KEYS), SCALARS), inner, max_size=4)),
    max_leaves=25)
DOCUMENTS = st.fixed_dictionaries({}, optional={"version": st.one_of(st.just(1), SCALARS),
                                               "defaults": VALUES, "kernels": st.lists(VALUES, max_size=3)})
SNIPPETS = ["&a ", "*a", "<<: ", "!!int ", "!!binary ", "!!timestamp ", "!custom ", "? ", "[", "{", "- ", "\t",
            "'", '"', "%YAML 1.1\n", "---\n", "...\n", "|\n", ": ", "\n  ", "#"]


def _judged(path) -> None:
    try:
        load(path)
    except ManifestError as exc:
        assert exc.problems and all(p.message for p in exc.problems)


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@FAST
@given(document=DOCUMENTS)
def test_generated_manifests_load_or_fail_with_problems(tmp_path, document):
    path = tmp_path / "kgate.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    _judged(path)


@FAST
@given(document=DOCUMENTS, cuts=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(SNIPPETS)), max_size=4))
def test_mangled_yaml_loads_or_fails_with_problems(tmp_path, document, cuts):
    text = yaml.safe_dump(document, allow_unicode=True)
    for at, snippet in cuts:
        at %= len(text) + 1
        text = text[:at] + snippet + text[at:]
    path = tmp_path / "kgate.yaml"
    path.write_text(text)
    _judged(path)


@FAST
@given(data=st.binary(max_size=300))
def test_random_bytes_load_or_fail_with_problems(tmp_path, data):
    path = tmp_path / "kgate.yaml"
    path.write_bytes(data)
    _judged(path)
