"""`kestrel.Executor` in place of ProcessPoolExecutor, and `@kestrel.task`."""

from __future__ import annotations

import concurrent.futures
import itertools

import kestrel


def power(x, exponent=2):
    return x**exponent


def takes_timeout(timeout):
    return f"timeout={timeout}"


def test_executor_code_runs_unchanged(client):
    with kestrel.Executor(client=client) as ex:
        assert isinstance(ex, concurrent.futures.Executor)
        assert list(ex.map(power, range(10), itertools.repeat(3))) == [x**3 for x in range(10)]
        f = ex.submit(power, 4, exponent=3)
        assert f.result(30) == 64
        # Every keyword argument is the function's, even one named like a job option.
        assert ex.submit(takes_timeout, timeout=5).result(30) == "timeout=5"


def test_an_executor_of_its_own_starts_and_stops_a_cluster():
    with kestrel.Executor(max_workers=2) as ex:
        assert sum(ex.map(power, range(100))) == sum(x * x for x in range(100))
        cluster = ex._cluster
    assert cluster is not None and cluster.server.poll() is not None


def test_a_task_function_returns_futures(client):
    @kestrel.task(retries=1)
    def triple(x):
        return 3 * x

    assert triple(5).result(30) == 15
    assert triple.local(2) == 6
    assert client.gather(triple.map(range(5))) == [0, 3, 6, 9, 12]
