"""Values: results and arguments above the inline limit stay in the workers' caches, move
worker to worker, never through the server, and go when their futures go."""

from __future__ import annotations

import gc
import hashlib
import os
import signal
import time

import pytest

import kestrel

MB = 1 << 20


def blob(n, seed=0):
    return bytes([seed % 251]) * n


def digest(data):
    return hashlib.sha256(data).hexdigest()


def through_server(client):
    t = client.server_info()["traffic"]
    return sum(t.values())


def values_deleted(client):
    return client.server_info()["values_deleted"][0]


def wait_for(check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("not within the timeout")
        time.sleep(0.05)


def test_a_large_result_stays_on_its_worker_and_is_read_where_it_is(client):
    before = through_server(client)
    f = client.submit(blob, 20 * MB, 7)
    f.exception(60)
    assert f.nbytes and f.nbytes > 20 * MB
    # Consumers on any worker read it there: the value never went through the server.
    readers = [client.submit(digest, f) for _ in range(4)]
    want = digest(blob(20 * MB, 7))
    assert client.gather(readers, timeout=60) == [want] * 4
    assert through_server(client) - before < MB
    # Asked for here, it comes from the worker (once; the future then holds it).
    assert f.result(60) == blob(20 * MB, 7)
    assert f.result() is f.result()


def test_a_dropped_future_deletes_its_value_from_the_caches(client):
    f = client.submit(blob, 3 * MB)
    f.exception(60)
    deleted = values_deleted(client)
    del f
    gc.collect()
    wait_for(lambda: values_deleted(client) > deleted)


def test_large_arguments_go_to_a_worker_and_not_through_the_server(client):
    before = through_server(client)
    data = blob(8 * MB, 3)
    assert client.submit(digest, data).result(60) == digest(data)
    # In a map, a large item goes as a call of its own, in its place among the others.
    results = client.map(len, [b"a", blob(3 * MB), b"bc"])
    assert client.gather(results, timeout=60) == [1, 3 * MB, 2]
    assert through_server(client) - before < MB


def test_a_scattered_value_is_read_by_every_call_given_it(client):
    table = client.scatter(blob(5 * MB, 9))
    assert table.nbytes > 5 * MB
    before = through_server(client)
    sums = client.map(digest, [table] * 6)
    assert client.gather(sums, timeout=60) == [digest(blob(5 * MB, 9))] * 6
    assert through_server(client) - before < MB
    deleted = values_deleted(client)
    del table, sums
    gc.collect()
    wait_for(lambda: values_deleted(client) > deleted)


def test_a_future_inside_a_container_is_refused_with_what_to_do(client):
    f = client.submit(pow, 2, 3)
    with pytest.raises(TypeError, match="argument of its own"):
        client.submit(sum, [f])


def test_a_result_larger_than_the_workers_cache_fails_saying_what_to_do():
    args = ["--cache-size", "4M"]
    with (
        kestrel.LocalCluster(workers=1, slots=1, worker_args=args) as cluster,
        kestrel.Client(cluster) as client,
    ):
        with pytest.raises(kestrel.TaskFailed, match=r"cannot keep it.*outputs=\[\.\.\.\]"):
            client.submit(blob, 6 * MB).result(60)
        # The worker goes on.
        assert client.submit(len, blob(2 * MB)).result(60) == 2 * MB


def test_a_result_lost_with_its_worker_is_made_again_when_it_is_needed():
    with kestrel.LocalCluster(workers=1, slots=1) as cluster, kestrel.Client(cluster) as client:
        read, asked = client.submit(blob, 3 * MB, 5), client.submit(blob, 3 * MB, 6)
        kestrel.wait([read, asked], 60)
        cluster.add_worker()
        cluster.wait_for_workers(2)
        holder = cluster.workers[0]
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        wait_for(lambda: len(client.workers()) == 1)
        # A call that reads one waits for its task to run again on the worker left.
        assert client.submit(digest, read).result(60) == digest(blob(3 * MB, 5))
        # Asked for here, the other is made again too.
        assert asked.result(60) == blob(3 * MB, 6)
        assert read.result(60) == blob(3 * MB, 5)


def test_a_scattered_value_lost_with_its_worker_raises_value_lost():
    with kestrel.LocalCluster(workers=1, slots=1) as cluster, kestrel.Client(cluster) as client:
        table = client.scatter(blob(2 * MB))
        cluster.add_worker()
        cluster.wait_for_workers(2)
        holder = cluster.workers[0]
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        wait_for(lambda: len(client.workers()) == 1)
        with pytest.raises(kestrel.ValueLost, match="held by no worker"):
            table.result(60)
        with pytest.raises(kestrel.ValueLost, match="no worker holds any more"):
            client.submit(len, table).result(60)
