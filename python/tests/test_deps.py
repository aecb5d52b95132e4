"""Futures as arguments: a call waits for them and runs with their values."""

from __future__ import annotations

import pytest

import kestrel


def inc(x):
    return x + 1


def add(a, b):
    return a + b


def fail(x):
    raise RuntimeError(f"no {x}")


def test_a_chain_of_calls_passes_each_value_on(client):
    f = client.submit(inc, 0)
    for _ in range(49):
        f = client.submit(inc, f)
    assert f.result(60) == 50


def test_futures_as_keyword_and_positional_arguments(client):
    a, b = client.submit(inc, 1), client.submit(inc, 10)
    assert client.submit(add, a, b=b).result(30) == 13


def test_a_failed_dependency_fails_its_dependents_without_running_them(client):
    bad = client.submit(fail, 1)
    after = client.submit(inc, bad)
    with pytest.raises(kestrel.DependencyFailed, match="no 1") as info:
        after.result(30)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert after.job is None  # never submitted
