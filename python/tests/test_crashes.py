"""Runners that die, workers killed mid-map, a server restarted: every future resolves."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import kestrel


def exit_hard(code):
    os._exit(code)


def segfault():
    import ctypes

    ctypes.string_at(0)


def sleepy(x):
    time.sleep(0.05)
    return x


def slow_square(x):
    time.sleep(0.02)
    return x * x


def test_a_runner_that_exits_fails_its_task_and_a_fresh_runner_follows(client):
    with pytest.raises(kestrel.TaskFailed, match="runner") as info:
        client.submit(exit_hard, 7).result(30)
    assert info.value.worker
    assert client.submit(pow, 3, 2).result(30) == 9


def test_a_segfault_fails_its_task_with_the_signal(client):
    with pytest.raises(kestrel.TaskFailed, match="SIGSEGV|signal 11"):
        client.submit(segfault).result(30)
    assert client.submit(pow, 2, 5).result(30) == 32


def test_a_worker_killed_mid_map_loses_no_future():
    with kestrel.LocalCluster(workers=2, slots=2) as cluster, kestrel.Client(cluster) as client:
        fs = list(client.map(slow_square, range(400)))
        # Let both workers take tasks, then kill one outright.
        while sum(f.done() for f in fs) < 40:
            time.sleep(0.01)
        victim = cluster.workers[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        assert client.gather(fs, timeout=120) == [x * x for x in range(400)]


def test_a_lost_server_fails_waiting_futures_instead_of_hanging():
    cluster = kestrel.LocalCluster(workers=1, slots=1)
    client = kestrel.Client(cluster)
    f = client.submit(time.sleep, 60)
    time.sleep(0.3)
    cluster.server.kill()
    with pytest.raises(kestrel.ConnectionLost):
        f.result(30)
    with pytest.raises(kestrel.ConnectionLost, match="new kestrel.Client"):
        client.submit(pow, 2, 2)
    client.close()
    cluster.close()


def test_a_server_restarted_with_its_journal_loses_no_future():
    with (
        kestrel.LocalCluster(workers=1, slots=2, journal=True) as cluster,
        kestrel.Client(cluster) as client,
    ):
        futures = list(client.map(sleepy, range(40)))
        done_before = client.submit(sleepy, -1)
        assert done_before.result(60) == -1
        time.sleep(0.3)
        cluster.restart_server()
        # Every future resolves with its value: those that ended before the crash, while
        # the client was away, and after.
        assert [f.result(120) for f in futures] == list(range(40))
        # And the client goes on submitting.
        assert client.submit(sleepy, 7).result(60) == 7
        # A submission made while the server is down waits for it to come back. (It is
        # made on a thread: the cluster's processes belong to the thread that starts them.)
        cluster.server.kill()
        cluster.server.wait()
        got = []
        waiting = threading.Thread(
            target=lambda: got.append(client.submit(sleepy, 8).result(60)), daemon=True
        )
        waiting.start()
        time.sleep(0.5)
        assert not got
        cluster.restart_server()
        waiting.join(60)
        assert got == [8]
        assert list(client.map(sleepy, range(3)).results(60)) == [0, 1, 2]


def test_a_server_that_does_not_come_back_fails_futures_after_the_window():
    with kestrel.LocalCluster(workers=1, slots=1, journal=True) as cluster:
        client = kestrel.Client(cluster, reconnect=1.0)
        f = client.submit(time.sleep, 60)
        time.sleep(0.3)
        cluster.server.kill()
        with pytest.raises(kestrel.ConnectionLost, match="not back within 1 s"):
            f.result(30)
        client.close()
