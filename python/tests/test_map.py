"""`Client.map`: in order, over several iterables, over generators with a bounded window."""

from __future__ import annotations

import itertools

import pytest

import kestrel
from kestrel import client as client_module


def square(x):
    return x * x


def test_map_keeps_the_order_of_its_items(client):
    fs = client.map(square, range(1000))
    assert len(fs) == 1000
    assert client.gather(fs) == [x * x for x in range(1000)]


def test_map_zips_its_iterables(client):
    assert list(client.map(pow, [2, 3, 4], [3, 2]).results(30)) == [8, 9]


def test_an_empty_map_has_no_futures(client):
    assert client.gather(client.map(square, [])) == []


def test_a_generator_is_read_as_its_futures_are_consumed(client):
    read = itertools.count()

    def items():
        for i in range(client_module._WINDOW * 3):
            next(read)
            yield i

    fs = client.map(square, items())
    # Only the window was read at the start, not the whole input.
    ahead = next(read)
    assert ahead <= client_module._WINDOW + 1
    total = 0
    for i, f in enumerate(fs):
        total += f.result(60)
        if i == 10:
            assert next(read) < client_module._WINDOW * 2
    assert total == sum(x * x for x in range(client_module._WINDOW * 3))


def test_a_failing_item_fails_only_its_own_future(client):
    def inverse(x):
        return 1 / x

    fs = list(client.map(inverse, [1, 0, 2]))
    assert fs[0].result(30) == 1 and fs[2].result(30) == 0.5
    assert isinstance(fs[1].exception(30), ZeroDivisionError)


def test_progress_draws_a_bar_and_returns_the_futures(client, capsys):
    fs = kestrel.progress(client.map(square, range(50)), desc="squares")
    assert [f.result() for f in fs] == [x * x for x in range(50)]
    assert "squares" in capsys.readouterr().err


def test_map_commands_runs_one_job_of_command_lines_in_order(client):
    fs = list(client.map_commands(["echo", str(i)] for i in range(300)))
    assert len({f.job for f in fs}) == 1
    assert [f.result(60).stdout for f in fs] == [f"{i}\n".encode() for i in range(300)]


def test_map_commands_fails_only_the_command_that_fails(client):
    fs = list(client.map_commands([["true"], ["sh", "-c", "exit 3"], ["true"]]))
    assert fs[0].result(30).returncode == 0 and fs[2].result(30).returncode == 0
    error = fs[1].exception(30)
    assert isinstance(error, kestrel.TaskFailed) and "3" in str(error)


def test_map_commands_refuses_what_is_not_a_command_line(client):
    with pytest.raises(TypeError, match="list of strings"):
        list(client.map_commands(["echo hi"]))
    with pytest.raises(ValueError, match="empty command line"):
        list(client.map_commands([[]]))


def task_ids(_):
    import os
    import subprocess

    mine = os.environ["KESTREL_TASK_ID"]
    child = subprocess.run(
        ["sh", "-c", "echo $KESTREL_TASK_ID"], check=True, capture_output=True, text=True
    )
    return mine, child.stdout.strip()


def test_each_call_sees_its_task_id_as_do_the_processes_it_starts(client):
    ids = client.gather(client.map(task_ids, range(20)))
    assert ids == [(str(i), str(i)) for i in range(20)]
