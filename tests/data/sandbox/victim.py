"""The kernel another kernel of the manifest tries to rewrite so that it passes (tests/test_sandbox.py)."""


def wrong(x):
    return x * 3
