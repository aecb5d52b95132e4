"""Futures of function calls and command lines: values, raises with their remote traceback,
failures, cancels, timeouts, and the concurrent.futures functions over them."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import kestrel


def add(a, b=0):
    return a + b


def boom(x):
    raise ValueError(f"bad value {x}")


def test_a_call_returns_its_value(client):
    f = client.submit(add, 2, b=40)
    assert f.result(30) == 42
    assert f.done() and not f.cancelled()
    assert f.exception() is None
    assert f.key == f"{f.job}:0"


def test_a_lambda_and_a_closure_travel_by_value(client):
    k = 7
    assert client.submit(lambda x: x * k, 6).result(30) == 42


def test_a_raise_re_raises_with_the_remote_traceback_and_the_worker(client):
    f = client.submit(boom, 3)
    with pytest.raises(ValueError, match="bad value 3") as info:
        f.result(30)
    cause = info.value.__cause__
    assert isinstance(cause, kestrel.RemoteTraceback)
    assert "raised on worker" in str(cause)
    assert "in boom" in str(cause)
    assert isinstance(f.exception(), ValueError)


def test_a_function_that_cannot_be_pickled_fails_at_submit(client):
    lock = threading.Lock()
    with pytest.raises(TypeError, match="lock"):
        client.submit(lambda: lock.locked())


def test_a_command_returns_its_output_and_a_failing_one_raises(client):
    done = client.submit(["sh", "-c", "echo hello"]).result(30)
    assert done.stdout == b"hello\n" and done.returncode == 0
    with pytest.raises(kestrel.TaskFailed, match="exit code 3") as info:
        client.submit(["sh", "-c", "echo oops >&2; exit 3"]).result(30)
    assert b"oops" in info.value.stderr
    assert "oops" in str(info.value)


def test_a_command_that_cannot_start_says_so(client):
    with pytest.raises(kestrel.TaskFailed, match="no-such-program"):
        client.submit(["/no/such/dir/no-such-program"]).result(30)


def test_callbacks_wait_and_as_completed(client):
    heard = []
    fs = [client.submit(add, i, 1) for i in range(10)]
    fs[0].add_done_callback(lambda f: heard.append(f.result()))
    assert sorted(f.result() for f in kestrel.as_completed(fs, timeout=30)) == list(range(1, 11))
    done, pending = kestrel.wait(fs, timeout=30)
    assert len(done) == 10 and not pending
    assert heard == [1]


def test_cancel_stops_a_running_call(client):
    f = client.submit(time.sleep, 60)
    time.sleep(0.5)
    assert f.cancel()
    assert f.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        f.result(1)
    # Its slot is free again: a quick call does not wait for the sleep.
    assert client.submit(add, 1, 1).result(20) == 2


def mark(directory, i):
    time.sleep(0.1)
    with open(os.path.join(directory, str(i)), "w") as f:
        f.write("ran")
    return i


def test_canceling_futures_of_a_map_cancels_their_tasks_alone(tmp_path):
    with (
        kestrel.LocalCluster(workers=1, slots=1) as cluster,
        kestrel.Client(cluster, keep_jobs=True) as client,
    ):
        fs = list(client.map(mark, [str(tmp_path)] * 20, range(20)))
        for f in fs[10:]:
            assert f.cancel()
        assert client.gather(fs[:10], timeout=60) == list(range(10))
        assert all(f.cancelled() for f in fs[10:])
        # The server ended the canceled tasks, so the map's job ends with the others.
        job = fs[0].job

        def counts():
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "kestrel",
                    "--server-dir",
                    str(cluster.directory),
                    "job",
                    "info",
                    str(job),
                    "--output",
                    "json",
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            return json.loads(out)["counts"]

        deadline = time.monotonic() + 30
        while counts()["canceled"] < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counts()["finished"] == 10 and counts()["canceled"] == 10
        ran = sorted(int(p.name) for p in tmp_path.iterdir())
        assert ran == list(range(10)), f"canceled tasks ran: {ran}"


def test_a_timeout_fails_the_task(client):
    with pytest.raises(kestrel.TaskFailed, match="timed out|timeout"):
        client.submit(time.sleep, 30, timeout=0.5).result(30)


def test_result_with_a_timeout_raises_timeout_error(client):
    f = client.submit(time.sleep, 2)
    with pytest.raises(concurrent.futures.TimeoutError):
        f.result(0.05)
    assert f.result(30) is None


def test_printed_output_does_not_disturb_the_result(client):
    def chatty(n):
        print("x" * n)
        os.write(1, b"straight to fd 1\n")
        return n

    assert client.submit(chatty, 1000).result(30) == 1000


def test_retries_run_a_flaky_call_again(client, tmp_path):
    marker = tmp_path / "tried"

    def flaky():
        if not marker.exists():
            marker.write_text("once")
            os._exit(3)
        return "second time"

    assert client.submit(flaky, retries=2).result(60) == "second time"


def test_unknown_options_are_refused(client):
    with pytest.raises(TypeError, match="unknown options"):
        client.map(add, [1], colour="red")


def test_a_command_reads_and_writes_files_of_the_clusters_store(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "in.txt").write_text("hello\n")
    with (
        kestrel.LocalCluster(workers=1, slots=1, store=store) as cluster,
        kestrel.Client(cluster) as client,
    ):
        f = client.submit(
            ["sh", "-c", "tr a-z A-Z < {input:in.txt} > out.txt"],
            inputs=["in.txt"],
            outputs=["out.txt"],
            cwd=str(tmp_path),
        )
        assert f.result(60).returncode == 0
        # A typo in an input's name is refused at submission, naming it.
        with pytest.raises(kestrel.ServerError, match="reads nope.txt, which no task writes"):
            client.submit(["cat", "{input:nope.txt}"], inputs=["nope.txt"])
    assert (store / "out.txt").read_text() == "HELLO\n"


def getenv(name):
    return os.environ.get(name)


def test_a_calls_environment_is_its_jobs(client):
    assert client.submit(getenv, "GREETING", env={"GREETING": "hi"}).result(30) == "hi"
    # Not left behind for the next job's calls.
    assert client.submit(getenv, "GREETING").result(30) is None
    assert client.submit(getenv, "KESTREL_JOB_ID").result(30).isdigit()
