# The README's two set-up commands: `make demo` and `make test`. Both create the venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch 2.13.0 lies on local disk on the project's machines; override elsewhere.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.kgate-installed
# The third-party kernel libraries the field manifests judge (examples/field/*/), pinned; installed without
# their dependencies, which pin CUDA builds of torch (the CPU wheel above serves them).
FIELD_REQUIREMENTS := $(wildcard examples/field/*/requirements.txt)

.PHONY: demo test lint venv clean

venv: $(STAMP)

# The venv's pip comes from the interpreter's own pip (pip >= 22.3 installs into another environment with
# --python), not from ensurepip's bundled copy that the upgrade would replace at once (7 s of the venv's
# 8 s); an interpreter without such a pip falls back to ensurepip.
# pip byte-compiles what it installs one file at a time (30 s of torch's 44 s here); compileall does it
# once, on every core (a file that does not compile is left as pip leaves it). Sandboxed workers cannot
# write bytecode into the venv, so it is all made here, but for the packages' own test folders (a tenth of
# the files), which nothing here imports.
$(STAMP): pyproject.toml $(FIELD_REQUIREMENTS)
	$(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(PY) install -q --upgrade pip 2>/dev/null || \
	  { $(PY) -m ensurepip -q && $(PY) -m pip install -q --upgrade pip; }
	$(PY) -m pip install -q --no-compile "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-compile -e ".[test]"
	$(if $(FIELD_REQUIREMENTS),$(PY) -m pip install -q --no-compile --no-deps $(addprefix -r ,$(FIELD_REQUIREMENTS)))
	$(PY) -m compileall -q -j 0 -x 'site-packages/.+/tests?/' \
	  $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') >/dev/null || true
	touch $@

# Runs kgate on the bundled example manifest on the CPU. kgate exits 1 when it finds violations,
# which is the point of the demo, so only 0 and 1 count as success here.
demo: $(STAMP)
	@$(VENV)/bin/kgate run examples/kgate.yaml --device cpu \
	  --junit kgate-out/demo-junit.xml --json kgate-out/demo-report.json; \
	  rc=$$?; [ $$rc -le 1 ] || exit $$rc; \
	  echo; echo "demo: JUnit XML in kgate-out/demo-junit.xml, JSON report in kgate-out/demo-report.json"

# pytest-xdist workers: the suite's tests are independent (tests/xdist_groups.py keeps those that share an
# expensive fixture on one worker); 2 matches CI's two cores. `make test TEST_JOBS=0` runs it in one process.
# The units go out longest first by the times in tests/durations.json; after adding or slowing tests,
# refresh it with `$(PY) -m pytest -q -n 2 --dist loadgroup --record-durations`.
TEST_JOBS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadgroup --durations=15

lint: $(STAMP)
	$(VENV)/bin/ruff check kgate tests fixtures gates hooks examples

clean:
	rm -rf $(VENV) kgate-out .pytest_cache
