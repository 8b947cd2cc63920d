"""KernelBench format: pairing, index files, free size parameters, seeded weights, problem isolation."""

from __future__ import annotations

import json

import pytest
import torch

from kgate import kernelbench as kb
from kgate.errors import UsageError
from tests.conftest import DATA

CORPUS = DATA / "kernelbench"


def _touch(path, text="x = 1\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_pairing_by_name_and_double_underscore(tmp_path):
    _touch(tmp_path / "p" / "level1" / "1_Add.py")
    _touch(tmp_path / "p" / "level2" / "7_Conv.py")
    _touch(tmp_path / "c" / "1_Add.py")
    _touch(tmp_path / "c" / "1_Add__sample_3.py")
    _touch(tmp_path / "c" / "deep" / "7_Conv__model-b.py")
    _touch(tmp_path / "c" / "99_Missing.py")
    pairs = {p.id: p for p in kb.discover(tmp_path / "p", tmp_path / "c")}
    assert set(pairs) == {"1_Add", "1_Add__sample_3", "deep/7_Conv__model-b", "99_Missing"}
    assert pairs["1_Add"].problem == tmp_path / "p" / "level1" / "1_Add.py"
    assert pairs["1_Add__sample_3"].problem == pairs["1_Add"].problem
    assert pairs["1_Add"].level == 1
    assert pairs["deep/7_Conv__model-b"].problem.name == "7_Conv.py" and pairs["deep/7_Conv__model-b"].level == 2
    assert pairs["99_Missing"].problem is None
    assert "no problem 99_Missing.py" in pairs["99_Missing"].problem_error


def test_a_problem_name_holding_double_underscores_pairs_by_its_longest_name(tmp_path):
    """Upstream level-1 names hold `__` (50_conv_standard_2D__square_input__square_kernel.py): a candidate of
    exactly that name, or that name plus `__sample`, goes with it, not with a problem `50_conv_standard_2D`."""
    name = "50_conv_standard_2D__square_input__square_kernel"
    _touch(tmp_path / "p" / "level1" / f"{name}.py")
    _touch(tmp_path / "p" / "level1" / "50_conv_standard_2D.py")  # a shorter name that must not win
    _touch(tmp_path / "c" / f"{name}.py")
    _touch(tmp_path / "c" / f"{name}__sample_2.py")
    _touch(tmp_path / "c" / "50_conv_standard_2D__square_input__other.py")
    _touch(tmp_path / "c" / "7_Nothing__square_input__x.py")
    pairs = {p.id: p for p in kb.discover(tmp_path / "p", tmp_path / "c")}
    assert pairs[name].problem == tmp_path / "p" / "level1" / f"{name}.py", pairs[name]
    assert pairs[f"{name}__sample_2"].problem == pairs[name].problem
    assert pairs["50_conv_standard_2D__square_input__other"].problem.name == "50_conv_standard_2D.py"
    missing = pairs["7_Nothing__square_input__x"]
    assert missing.problem is None
    assert "no problem 7_Nothing__square_input__x.py or 7_Nothing__square_input.py or 7_Nothing.py" in \
        missing.problem_error, missing.problem_error


def test_same_subfolder_wins_and_ambiguity_is_explained(tmp_path):
    _touch(tmp_path / "p" / "level1" / "1_X.py")
    _touch(tmp_path / "p" / "level2" / "1_X.py")
    _touch(tmp_path / "c" / "level2" / "1_X__a.py")
    _touch(tmp_path / "c" / "1_X__b.py")
    pairs = {p.id: p for p in kb.discover(tmp_path / "p", tmp_path / "c")}
    assert pairs["level2/1_X__a"].problem == tmp_path / "p" / "level2" / "1_X.py"
    assert pairs["1_X__b"].problem is None and "ambiguous" in pairs["1_X__b"].problem_error


@pytest.mark.parametrize("fmt", ["json-list", "json-dict", "csv"])
def test_index_overrides_names_and_keeps_labels(tmp_path, fmt):
    _touch(tmp_path / "p" / "level1" / "19_ReLU.py")
    _touch(tmp_path / "c" / "run_a" / "level_1" / "problem_19.py")
    cand, prob = "run_a/level_1/problem_19.py", "level1/19_ReLU.py"
    if fmt == "json-list":
        index = tmp_path / "index.json"
        index.write_text(json.dumps([{"candidate": cand, "problem": prob, "harness_correct": True, "level": 1}]))
    elif fmt == "json-dict":
        index = tmp_path / "index.json"
        index.write_text(json.dumps({cand: prob}))
    else:
        index = tmp_path / "index.csv"
        index.write_text(f"candidate,problem,harness_correct\n{cand},{prob},true\n")
    (pair,) = kb.discover(tmp_path / "p", tmp_path / "c", index)
    assert pair.id == "run_a/level_1/problem_19"
    assert pair.problem == tmp_path / "p" / "level1" / "19_ReLU.py"
    assert pair.level == 1
    if fmt != "json-dict":
        assert pair.labels["harness_correct"].lower() == "true"


def test_bad_inputs_are_usage_errors(tmp_path):
    _touch(tmp_path / "p" / "a.py")
    (tmp_path / "c").mkdir()
    with pytest.raises(UsageError, match="no .py files"):
        kb.discover(tmp_path / "p", tmp_path / "c")
    with pytest.raises(UsageError, match="not a folder"):
        kb.discover(tmp_path / "nope", tmp_path / "c")
    index = tmp_path / "i.csv"
    index.write_text("candidate,problem\nmissing.py,a.py\n")
    with pytest.raises(UsageError, match="candidate 'missing.py' not found"):
        kb.discover(tmp_path / "p", tmp_path / "c", index)
    index.write_text("candidate,problem\n,a.py\n")
    with pytest.raises(UsageError, match="line 2 needs both"):
        kb.discover(tmp_path / "p", tmp_path / "c", index)


def test_index_files_as_people_write_them(tmp_path):
    """A spreadsheet's CSV (byte-order mark, spaces after commas), JSON in a file not named .json; and the
    header, an extra field and the row's line named when they are wrong."""
    _touch(tmp_path / "p" / "a.py")
    _touch(tmp_path / "c" / "x.py")
    _touch(tmp_path / "c" / "y.py")
    index = tmp_path / "i.csv"
    index.write_text("\ufeffcandidate, problem, run\nx.py, a.py, r1\n", encoding="utf-8")
    (pair,) = kb.discover(tmp_path / "p", tmp_path / "c", index)
    assert (pair.id, pair.problem.name, pair.labels) == ("x", "a.py", {"run": "r1"})
    listing = tmp_path / "pairs.txt"
    listing.write_text(json.dumps([{"candidate": "x.py", "problem": "a.py"}]))
    assert [p.id for p in kb.discover(tmp_path / "p", tmp_path / "c", listing)] == ["x"]
    for text, message in [("cand;prob\nx.py;a.py\n", "line 1 must be a comma-separated header"),
                          ("candidate,problem\nx.py,a.py,extra\n", "line 2 has more fields than the header"),
                          ("candidate,problem\nx.py,a.py\nz.py,a.py\n", "line 3: candidate 'z.py' not found"),
                          ("candidate,problem\nx.py,a.py\ny.py,a.py\nx.py,a.py\n", r"listed twice \(line 2 and line 4\)")]:
        index.write_text(text)
        with pytest.raises(UsageError, match=message):
            kb.discover(tmp_path / "p", tmp_path / "c", index)


def test_hidden_folders_caches_and_package_markers_are_not_candidates(tmp_path):
    _touch(tmp_path / "p" / "a.py")
    _touch(tmp_path / "c" / "a.py")
    _touch(tmp_path / "c" / ".ipynb_checkpoints" / "a.py")
    _touch(tmp_path / "c" / "__init__.py")
    _touch(tmp_path / "c" / "__pycache__" / "a.py")
    _touch(tmp_path / "c" / "run" / "__init__.py")
    assert [p.id for p in kb.discover(tmp_path / "p", tmp_path / "c")] == ["a"]
    # a hidden folder above the corpus is not a reason to skip it
    _touch(tmp_path / ".corpora" / "p" / "a.py")
    _touch(tmp_path / ".corpora" / "c" / "a.py")
    assert [p.id for p in kb.discover(tmp_path / ".corpora" / "p", tmp_path / ".corpora" / "c")] == ["a"]


def test_free_size_parameters_change_inputs_but_not_weights():
    relu = kb.exec_problem(CORPUS / "problems" / "level1" / "19_ReLU.py", "inputs")
    dims = kb.free_dims(relu)
    assert dims.names == ["batch_size", "dim"] and dims.defaults == [4, 33]
    linear = kb.exec_problem(CORPUS / "problems" / "level2" / "9_Linear_Scale.py", "inputs")
    dims = kb.free_dims(linear)
    # in_features and out_features shape the weights: only the batch can move.
    assert dims.names == ["batch_size"]
    make = kb.ProblemInputs(linear, dims)
    (x,) = make(0, (7,))
    assert tuple(x.shape) == (7, 8)
    (x,) = make(0, None)
    assert tuple(x.shape) == (3, 8)
    assert linear.batch_size == 3, "scaling must not leave the module changed"
    with pytest.raises(ValueError, match="1 free size parameter"):
        make(0, (2, 3))


def _sized_problem(path, args, result, sizes, inputs_body):
    """A KernelBench problem file `forward(args) -> result` with module-level `sizes`, loaded as the
    inputs copy, and its free size parameters."""
    _touch(path, f"import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, {args}):\n"
                 f"        return {result}\n{sizes}def get_inputs():\n    {inputs_body}\n"
                 "def get_init_inputs():\n    return []\n")
    module = kb.exec_problem(path, "inputs")
    return module, kb.free_dims(module)


def test_working_shape_halves_the_largest_size_until_within_budget(tmp_path):
    module, dims = _sized_problem(tmp_path / "big.py", "a, b", "a @ b", "M = 2048\nK = 8192\nN = 4096\n",
                                  "return [torch.randn(M, K), torch.randn(K, N)]")
    assert dims.names == ["M", "K", "N"]
    assert kb.input_elements(module, dims, None) == 2048 * 8192 + 8192 * 4096  # counted on meta: no memory
    shape = kb.working_shape(module, dims, budget=1 << 16)
    assert shape is not None
    m, k, n = shape
    assert m * k + k * n <= 1 << 16
    assert all(s >= 1 for s in shape) and max(shape) <= 2 * min(shape)  # largest first keeps them balanced
    assert (module.M, module.K, module.N) == (2048, 8192, 4096), "scaling must not leave the module changed"
    # within budget already, or nothing to scale: the problem's own shape
    assert kb.working_shape(module, dims, budget=10**9) is None
    assert kb.working_shape(module, dims, budget=0) is None
    assert kb.working_shape(module, kb.FreeDims([], []), budget=16) is None


def test_working_shape_skips_sizes_the_problem_rejects(tmp_path):
    # `dim` must stay even (get_inputs raises otherwise): halving 6 to 3 is illegal, so batch_size moves
    module, dims = _sized_problem(tmp_path / "even.py", "x", "x", "batch_size = 4\ndim = 6\n",
                                  "assert dim % 2 == 0\n    return [torch.randn(batch_size, dim)]")
    assert dims.names == ["batch_size", "dim"]
    assert kb.working_shape(module, dims, budget=12) == (2, 6)


def test_problem_without_free_parameters_says_why(tmp_path):
    problem = _touch(tmp_path / "fixed.py", "import torch\nimport torch.nn as nn\n"
                     "class Model(nn.Module):\n    def forward(self, x):\n        return x\n"
                     "def get_inputs():\n    return [torch.randn(3, 5)]\n"
                     "def get_init_inputs():\n    return []\n")
    dims = kb.free_dims(kb.exec_problem(problem, "inputs"))
    assert dims.names == [] and "own shape only" in dims.note


def test_seeded_construction_gives_equal_weights():
    module = kb.exec_problem(CORPUS / "problems" / "level2" / "9_Linear_Scale.py", "reference")
    candidate = kb.exec_candidate(CORPUS / "candidates" / "level2" / "9_Linear_Scale.py")
    reference, new = kb.build_models(module, candidate.ModelNew, torch.device("cpu"))
    assert torch.equal(reference.linear.weight, new.linear.weight)
    assert torch.equal(reference.linear.bias, new.linear.bias)


def test_problem_copies_are_separate_and_tampering_is_seen():
    path = CORPUS / "problems" / "level1" / "19_ReLU.py"
    a, b = kb.exec_problem(path, "reference"), kb.exec_problem(path, "inputs")
    assert a is not b and a.get_inputs is not b.get_inputs
    assert a.__name__ not in __import__("sys").modules
    before = kb.fingerprint(b)
    assert kb.tampering(before, b) is None
    b.batch_size = 1
    b.get_inputs = lambda: []
    found = kb.tampering(before, b)
    assert found and "batch_size" in found and "get_inputs" in found
    assert kb.tampering(kb.fingerprint(a), a) is None


def test_the_candidate_sees_the_problems_names_as_kernelbench_gives_them(tmp_path):
    """KernelBench executes the problem and then the candidate in one namespace: a candidate may use
    `math` or `batch_size` that only the problem defines (one accepted corpus kernel did, and failed
    under kgate with "name 'math' is not defined"). The names are a copy's: rebinding them leaves the
    modules kgate judges with as they were."""
    problem = _touch(tmp_path / "p.py", (
        "import math\nimport torch\n\nclass Model(torch.nn.Module):\n"
        "    def forward(self, x):\n        return x * math.pi\n\nscale = 2.0\nbatch = 7\n"
        "def get_inputs():\n    return [torch.ones(2)]\n\ndef get_init_inputs():\n    return []\n"))
    candidate = _touch(tmp_path / "c.py", (
        "import torch\n\nclass ModelNew(Model):\n"
        "    def __init__(self):\n        super().__init__()\n        self.k = math.sqrt(scale * 8)\n"
        "batch = 100\n"))
    reference = kb.exec_problem(problem, "reference")
    module = kb.exec_candidate(candidate, problem)
    assert module.ModelNew().k == 4.0 and module.batch == 100  # its own definition replaced the problem's
    assert reference.batch == 7 and module.Model is not reference.Model
    with pytest.raises(NameError, match="Model"):  # without the problem: what it does not import is not there
        kb.exec_candidate(candidate)


def test_a_problem_missing_get_inputs_is_a_problem_error(tmp_path):
    problem = _touch(tmp_path / "bad.py", "class Model: pass\n")
    with pytest.raises(kb.ProblemError, match="get_inputs"):
        kb.exec_problem(problem, "reference")


def test_pair_entry_offers_what_gates_read_from_a_manifest_kernel(write_manifest):
    from kgate.manifest import load

    manifest = load(write_manifest("""
        version: 1
        kernels:
          - name: k
            kernel: k.py:f
            reference: k.py:f
        """, {"k.py": "def f(x):\n    return x\n"}))
    resolved = manifest.kernels[0]
    entry = kb.PairEntry("c", CORPUS / "candidates" / "level1" / "19_ReLU.py",
                         CORPUS / "problems" / "level1" / "19_ReLU.py", [None], [0], ["float32"])
    manifest_only = {"index", "manifest", "kernel", "reference", "line"}  # file positions of a YAML entry
    assert set(vars(resolved)) - manifest_only <= set(vars(entry))
    assert type(entry.entry) is type(resolved.entry)


def _tri_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    n = (shape or (16, 16))[0]
    return tuple(torch.randn(n, n, generator=gen).triu().to(dtype=dtype, device=device) for _ in range(2))


def _tri_reference(a, b):
    return torch.triu(a @ b)


def _tri_kernel(a, b):
    """Relies on the problem's domain: reads only the upper halves (the lower ones are known zeros)."""
    return torch.triu(a.triu() @ b.triu())


def test_matrix_structure_names_what_get_inputs_gave():
    from kgate.kernelbench import DIAGONAL, LOWER, SYMMETRIC, UPPER, matrix_structure

    x = torch.randn(2, 5, 5)
    assert matrix_structure(x.triu()) == UPPER and matrix_structure(x.tril()) == LOWER
    assert matrix_structure(x + x.mT) == SYMMETRIC and matrix_structure(torch.diag_embed(torch.randn(2, 5))) == DIAGONAL
    assert matrix_structure(x) is None and matrix_structure(torch.randn(5)) is None
    assert matrix_structure(torch.zeros(5, 5)) is None and matrix_structure(torch.randn(5, 4).triu()) is None


def test_conform_keeps_each_argument_in_its_structure():
    from kgate.kernelbench import conform, matrix_structure

    a, s, g = torch.randn(6, 6).triu(), torch.randn(6, 6), torch.randn(6, 6)
    s = s + s.mT
    probe = (torch.full((6, 6), float("nan")), torch.randn(6, 6), torch.ones(6, 6))
    out = conform((a, s, g), probe)
    assert matrix_structure(out[0].nan_to_num(1.0)) is not None and not out[0].tril(-1).any()
    assert torch.equal(out[1], out[1].mT) and torch.equal(out[1].triu(), probe[1].triu())
    assert out[2] is probe[2]


@pytest.mark.parametrize("gate", ["special_values", "distributions"])
def test_probes_stay_in_a_triangular_problems_domain(gate):
    from kgate import gates as registry
    from kgate.kernelbench import conform
    from tests.gate_harness import subject_for

    # n = 12: the seeded NaN injection lands in the lower (known-zero) half of an input
    plain = subject_for(_tri_kernel, _tri_reference, _tri_inputs, shapes=[[12, 12]])
    # without the problem's structure the probes leave its domain and the structure-reliant kernel "fails"
    assert registry.get(gate).check(plain).verdict == "fail"
    kept = subject_for(_tri_kernel, _tri_reference, _tri_inputs, shapes=[[12, 12]])
    kept.conform = conform
    result = registry.get(gate).check(kept)
    assert result.verdict == "pass", result.message
    # and a kernel wrong inside the domain is still caught: values off by 0.1 %, or NaN dropped
    def off(a, b):
        return _tri_kernel(a, b) * (1 + 1e-3)

    def nan_dropping(a, b):
        return torch.nan_to_num(_tri_kernel(a, b), nan=0.0)

    wrong = subject_for(off if gate == "distributions" else nan_dropping, _tri_reference, _tri_inputs,
                        shapes=[[12, 12]])
    wrong.conform = conform
    assert registry.get(gate).check(wrong).verdict == "fail"


class _LambdaBlock(torch.nn.Module):
    """As KernelBench's MiniGPTBlock: a function stored on the module, closing over its submodules."""

    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.ModuleDict(dict(fc=torch.nn.Linear(8, 16), proj=torch.nn.Linear(16, 8)))
        m = self.mlp
        self.mlpf = lambda x: m.proj(torch.relu(m.fc(x)))
        self.scale = lambda x: x * self.gain  # closing over the module itself
        self.gain = 2.0

    def forward(self, x):
        return self.scale(x + self.mlpf(x))


def test_the_float64_oracle_of_a_model_whose_lambdas_close_over_its_layers():
    """The oracle's float64 copy of such a model runs its own (float64) layers: a plain deep copy kept the
    lambdas, which called the original float32 layers ('mat1 and mat2 must have the same dtype' here, a
    device mismatch on the H200 where the copy had moved to the CPU). The original is left as it was."""
    from kgate.oracle import DtypeDispatch, converted_copy

    torch.manual_seed(0)
    model = _LambdaBlock()
    x = torch.randn(4, 8)
    dispatch = DtypeDispatch(model)
    got = dispatch(x.double())
    assert got.dtype == torch.float64
    with torch.no_grad():
        want = 2.0 * (x.double() + torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(
            x.double(), model.mlp.fc.weight.double(), model.mlp.fc.bias.double())),
            model.mlp.proj.weight.double(), model.mlp.proj.bias.double()))
    torch.testing.assert_close(got, want)
    assert next(model.parameters()).dtype == torch.float32 and dispatch(x).dtype == torch.float32
    copy64 = converted_copy(model, device=torch.device("cpu"), dtype=torch.float64)
    copy64.gain = 3.0  # the copy's lambda reads the copy
    assert torch.allclose(copy64(x.double()), want * 1.5) and model(x).dtype == torch.float32


def test_a_closure_cell_that_is_still_empty_is_copied_as_empty():
    from kgate.oracle import converted_copy

    def make():
        def later_bound():
            return later  # noqa: F821 - bound below, after the return: the cell stays empty

        return later_bound
        later = 1  # noqa: F841

    module = torch.nn.Linear(2, 2)
    module.hook = make()
    dup = converted_copy(module, device=torch.device("cpu"), dtype=torch.float64)
    with pytest.raises(NameError):
        dup.hook()


def test_kernelbench_input_processing_casts_floating_tensors_only():
    ints, mask, x = torch.arange(5), torch.tensor([True, False]), torch.ones(3, dtype=torch.float64)
    out = kb.to_device([ints, mask, x, 7], "cpu", torch.float16)
    assert out[0].dtype == torch.int64 and torch.equal(out[0], ints)
    assert out[1].dtype == torch.bool and torch.equal(out[1], mask)
    assert out[2].dtype == torch.float16 and out[3] == 7


class _DrawsInForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(20, 20)

    def forward(self, x):
        state = torch.randn(x.shape[0], 20)  # torch's default dtype, as KernelBench's LSTM problems draw
        noise = torch.empty_like(x).normal_()
        return self.w(x + state) + noise


def test_the_float64_oracle_runs_in_float64_and_draws_what_the_reference_draws():
    from kgate.oracle import DtypeDispatch

    torch.manual_seed(0)
    model, x = _DrawsInForward(), torch.rand(4, 20)
    dispatch = DtypeDispatch(model, seed=5)
    reference = dispatch(x)
    oracle = dispatch(x.double())  # raised 'mat1 and mat2 must have the same dtype'
    assert oracle.dtype == torch.float64 and torch.get_default_dtype() == torch.float32
    assert (oracle - reference.double()).abs().max() < 1e-5  # the same draws, upcast
    assert torch.equal(dispatch(x), reference)  # every call draws from the same seed
    rng = torch.get_rng_state()
    kb.NoGrad(model, seed=5)(x)
    assert torch.equal(torch.get_rng_state(), rng)  # the generator's state is left as it was


def test_the_default_dtype_is_restored_when_the_oracle_raises():
    from kgate.oracle import DtypeDispatch

    class Raises(torch.nn.Linear):
        def forward(self, x):
            assert torch.get_default_dtype() == torch.float64
            raise ValueError("outside the domain")

    with pytest.raises(ValueError):
        DtypeDispatch(Raises(2, 2))(torch.ones(2, dtype=torch.float64))
    assert torch.get_default_dtype() == torch.float32


class _BagMean(torch.nn.Module):
    """A mean over bags of embedding rows: its only input is integer indices."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bag = torch.nn.EmbeddingBag(64, 8, mode="mean")

    def forward(self, indices):
        return self.bag(indices)


class _BagMeanReordered(_BagMean):
    """The same mean as one gather and a float32 sum in another order (a correct kernel)."""

    def forward(self, indices):
        rows = self.bag.weight.index_select(0, indices.reshape(-1)).view(*indices.shape, -1)
        return rows.sum(dim=-2) / indices.shape[-1]


class _BagMeanHalfTotal(_BagMean):
    """The same mean with a float16 running total (a flawed kernel)."""

    def forward(self, indices):
        rows = self.bag.weight.index_select(0, indices.reshape(-1)).view(*indices.shape, -1)
        total = torch.zeros(rows.shape[0], rows.shape[-1], dtype=torch.float16)
        for j in range(rows.shape[1]):
            total = total + rows[:, j].half()
        return total.float() / indices.shape[-1]


def _bag_indices(seed, shape=None, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 64, (2, 3000), generator=g).to(device),)


def test_the_float64_oracle_of_a_model_whose_inputs_are_all_integers_runs_in_float64():
    """No floating argument says which dtype to run at: inside `oracle_call` the model runs as its float64
    copy (before, the oracle ran the float32 model itself, so the reference's error read 0)."""
    from kgate.oracle import DtypeDispatch, oracle_call

    model = _BagMean()
    indices = _bag_indices(0)[0]
    dispatch = DtypeDispatch(model)
    assert dispatch(indices).dtype == torch.float32
    with oracle_call(torch.device("cpu")):
        got = dispatch(indices)
    assert got.dtype == torch.float64
    want = torch.nn.functional.embedding_bag(indices, model.bag.weight.double(), mode="mean")
    assert torch.equal(got, want)
    assert next(model.parameters()).dtype == torch.float32


def test_the_oracle_gate_judges_integer_input_models_against_float64():
    """A correct float32 sum in another order than the reference's passes (the bound is calibrated from the
    reference's own float32 error, no longer 0); a float16 running total fails."""
    from tests.gate_harness import check

    reference = _BagMean()
    good = check("oracle", _BagMeanReordered(), reference, _bag_indices)
    assert good.verdict == "pass", good.message
    bad = check("oracle", _BagMeanHalfTotal(), reference, _bag_indices)
    assert bad.verdict == "fail", bad.message


WEIGHTS_PROBLEM = """import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.proj = nn.Parameter(torch.randn(hidden, features))  # sized by a global its __init__ reads
    def forward(self, x):
        return (x * self.scale) @ self.proj.t()
batch_size = 4
features = 64
hidden = 32
kernel_size = 3
def get_inputs():
    return [torch.randn(batch_size, features)]
def get_init_inputs():
    return [features]
"""


def test_the_integers_that_size_the_weights_are_found_and_halved_within_budget(tmp_path):
    module = kb.exec_problem(_touch(tmp_path / "weights.py", WEIGHTS_PROBLEM), "inputs")
    dims = kb.free_dims(module)
    assert dims.names == ["batch_size"]
    init = kb.init_dims(module, dims)
    # features changes get_init_inputs(), hidden only the Model's weight shapes; kernel_size is below
    # MIN_MODEL_SIZE (kernel sizes, strides, groups are not sizes of a weight)
    assert init.names == ["features", "hidden"] and init.defaults == [64, 32]
    sizes = kb.model_size_variants(module, dims, init, None)
    assert [s.overrides for s in sizes] == [{"features": 65, "hidden": 33}, {"features": 65}, {"hidden": 33}]
    assert "the problem's 64" in sizes[1].label
    # 4 x 65 inputs + 65 + 33 x 65 weights (2,470 elements) pass a budget of 1000: halved (then + 1) until within
    # it (4 x 33 + 33 + 17 x 33 = 726)
    small = kb.model_size_variants(module, dims, init, None, budget=1000)
    assert small[0].overrides == {"features": 33, "hidden": 17}
    assert all(kb.MIN_MODEL_SIZE <= v for s in small for v in s.overrides.values())
    assert (module.features, module.hidden) == (64, 32), "counting must not leave the module changed"
    with kb.overridden([module], {"features": 65}, {"features": 64}):
        assert module.features == 65
    assert module.features == 64


FIXED_INPUTS_PROBLEM = """import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self, rows, cols):
        super().__init__()
        self.gain = nn.Parameter(torch.randn(rows, cols))
    def forward(self, x):
        return self.gain * x
rows, cols = 48, 80
depth: int = 3
def get_inputs():
    return [torch.randn(rows, cols)]
def get_init_inputs():
    return [rows, cols]
"""


def test_sizes_written_into_the_source_reach_tuple_and_annotated_assignments(tmp_path):
    path = _touch(tmp_path / "fixed.py", FIXED_INPUTS_PROBLEM)
    module = kb.exec_problem(path, "inputs", {"rows": 49, "cols": 81, "depth": 5})
    assert (module.rows, module.cols, module.depth) == (49, 81, 5)
    assert tuple(module.get_inputs()[0].shape) == (49, 81), "get_inputs() must make inputs at the written sizes"


def test_inputs_without_a_free_size_get_one_large_size_of_the_weights(tmp_path):
    module = kb.exec_problem(_touch(tmp_path / "fixed.py", FIXED_INPUTS_PROBLEM), "inputs")
    dims = kb.free_dims(module)
    assert dims.names == []
    init = kb.init_dims(module, dims)
    assert init.names == ["rows", "cols"]
    sizes = kb.model_size_variants(module, dims, init, None)
    large = sizes[-1]
    assert len(sizes) == 4 and set(large.overrides) == {"rows", "cols"}, [s.overrides for s in sizes]
    inputs = large.overrides["rows"] * large.overrides["cols"]
    assert kb.MANY_INPUT_ELEMENTS < inputs and 2 * inputs <= kb.MODEL_ELEMENTS, large.overrides
    assert f"inputs of {inputs:,} elements" in large.label
    # weights that grow faster than the inputs pass the budget first: no large size
    assert kb.model_size_variants(module, dims, init, None, budget=1 << 20)[-1:] != [large]
    # where the inputs have a free size, the shapes gate's own sweep takes them past 2^20 elements instead
    weights = kb.exec_problem(_touch(tmp_path / "weights.py", WEIGHTS_PROBLEM), "inputs")
    free = kb.free_dims(weights)
    assert all("inputs of" not in s.label for s in kb.model_size_variants(weights, free, kb.init_dims(weights, free),
                                                                         None))


WEIGHT_TAIL = '''import torch
import torch.nn as nn
class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.proj = nn.Parameter(torch.randn(hidden, features))
    def forward(self, x):
        n = x.shape[-1]
        bulk = n - n % 16
        y = x.clone()
        y[:, :bulk] = x[:, :bulk] * self.scale[:bulk]  # BODY
        return y @ self.proj.t()
'''


def test_the_shapes_gate_builds_both_models_at_other_sizes_of_the_weights(tmp_path):
    """A tail over a weight dimension that the problem's own sizes (multiples of 16) never have: caught with
    the weights sized + 1; the same kernel with its tail scaled passes; one that refuses other sizes when
    built is passed over (a domain it states)."""
    from kgate.audit.results import ResultsFile
    from kgate.cli import main as kgate_main

    problems, candidates = tmp_path / "problems", tmp_path / "candidates"
    _touch(problems / "weights.py", WEIGHTS_PROBLEM)
    _touch(candidates / "weights__unscaled_tail.py", WEIGHT_TAIL)
    _touch(candidates / "weights__scaled_tail.py", WEIGHT_TAIL.replace(
        "  # BODY", "\n        y[:, bulk:] = x[:, bulk:] * self.scale[bulk:]"))
    _touch(candidates / "weights__own_sizes_only.py", WEIGHT_TAIL.replace(
        "        super().__init__()\n", "        super().__init__()\n        assert features % 16 == 0\n", 1))
    out = tmp_path / "run"
    kgate_main(["audit", "--format", "kernelbench", "--problems", str(problems), "--candidates", str(candidates),
                "--device", "cpu", "--jobs", "1", "--gate", "shapes", "--out", str(out), "-q"])
    gates = {r["id"]: r["gates"][0] for r in ResultsFile(out / "results.jsonl").read().values()}
    tail, scaled, own = (gates[f"weights__{n}"] for n in ("unscaled_tail", "scaled_tail", "own_sizes_only"))
    assert tail["verdict"] == "fail" and "weights sized features=65, hidden=33" in tail["message"], tail["message"]
    assert tail["details"]["model_size"] == {"features": 65, "hidden": 33}
    assert scaled["verdict"] == "pass" and "weights sized features=65, hidden=33 (the problem's 64, 32), then " \
        "features=65" in scaled["message"], scaled["message"]
    assert own["verdict"] == "pass" and "passed over at 2 other size(s)" in own["message"] and \
        "ModelNew raised AssertionError when built there" in own["message"], own["message"]


def test_torchs_own_dynamo_wrapper_is_no_tampering_and_a_lookalike_is(monkeypatch):
    """torch._dynamo, when first imported (a Model built on the meta device can import it), wraps torch.manual_seed
    in torch._disable_dynamo: torch's doing, not the candidate's. A wrapper of the candidate's own, even one that
    names the original as __wrapped__, is a replacement."""
    import functools

    original = torch.manual_seed
    before = kb.torch_fingerprint()
    monkeypatch.setattr(torch, "manual_seed", torch._disable_dynamo(original))
    assert kb.torch_tampering(before) is None

    @functools.wraps(original)
    def lookalike(seed):
        return original(seed + 1)

    monkeypatch.setattr(torch, "manual_seed", lookalike)
    assert "torch.manual_seed" in (kb.torch_tampering(before) or "")
