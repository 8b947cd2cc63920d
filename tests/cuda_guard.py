"""pytest plugin (tests/conftest.py loads it): a test that destroys the process's CUDA context.

After an illegal address (or another sticky CUDA error) every later launch in that process fails, so one
faulting test used to fail every test after it in the same pytest process: an H200 run had
69 failures from two faults. When a failed test's error is such a fault (`kgate.faults.context_lost`),
the process ends right after that test: under pytest-xdist the worker exits and xdist starts a fresh
one for the tests left (the faulting test is reported as the worker's crash); without xdist the
run stops, saying why. Only failures other than assertions are looked at.
"""

from __future__ import annotations

import os
import sys

import pytest

from kgate.faults import context_lost

_LOST = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # An AssertionError only quotes what a test checked (kgate's own messages name CUDA faults): the
    # fault this guards against arrives as the error of a launch or a synchronization.
    if report.failed and call.excinfo is not None and not isinstance(call.excinfo.value, AssertionError):
        line = context_lost(call.excinfo.value)
        if line is not None:
            item.stash[_LOST] = line


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    line = item.stash.get(_LOST, None)
    if line is None:
        return
    message = (f"{item.nodeid} lost this process's CUDA context ({line}); no later test here could launch "
               "anything")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        sys.stderr.write(f"\n{message}: ending this xdist worker so that a fresh one runs the rest\n")
        sys.stderr.flush()
        os._exit(3)
    item.session.shouldstop = f"{message}: stopping (run with -n N to go on in fresh processes)"
