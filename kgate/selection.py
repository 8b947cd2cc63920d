"""`-k EXPR` as pytest has it: words match as substrings of kernel names, combined with and/or/not and
parentheses. An expression equal to a kernel's name selects exactly that kernel (reproducers rely on it)."""

from __future__ import annotations

import re

from kgate.errors import UsageError

_TOKEN = re.compile(r"\s*(\(|\)|and\b|or\b|not\b|[^\s()]+)")


def matcher(expr: str, names: list[str]):
    """A predicate name -> bool; raises UsageError on a malformed expression."""
    if expr in names:
        return lambda name: name == expr
    tokens = _TOKEN.findall(expr)
    if not tokens or "".join(tokens).replace(" ", "") != expr.replace(" ", ""):
        raise UsageError(f"-k: cannot parse {expr!r}")
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise UsageError(f"-k: unexpected end of {expr!r}")
        pos += 1
        return tokens[pos - 1]

    def parse_or():
        left = parse_and()
        while peek() == "or":
            take()
            right = parse_and()
            left = (lambda a, b: lambda n: a(n) or b(n))(left, right)
        return left

    def parse_and():
        left = parse_not()
        while peek() == "and":
            take()
            right = parse_not()
            left = (lambda a, b: lambda n: a(n) and b(n))(left, right)
        return left

    def parse_not():
        if peek() == "not":
            take()
            inner = parse_not()
            return lambda n: not inner(n)
        token = take()
        if token == "(":
            inner = parse_or()
            if take() != ")":
                raise UsageError(f"-k: missing ')' in {expr!r}")
            return inner
        if token in (")", "and", "or"):
            raise UsageError(f"-k: unexpected {token!r} in {expr!r}")
        return lambda n: token in n

    predicate = parse_or()
    if pos != len(tokens):
        raise UsageError(f"-k: unexpected {tokens[pos]!r} in {expr!r}")
    return predicate
