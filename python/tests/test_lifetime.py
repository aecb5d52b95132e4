"""What a LocalCluster leaves behind and starts of itself: nothing when its interpreter is
killed, and workers of allocation queues that run this package's `kestrel`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import kestrel


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by its new parent) has ended too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_interpreter_takes_its_cluster_with_it(tmp_path):
    script = textwrap.dedent(
        """
        import sys, time, kestrel
        cluster = kestrel.LocalCluster(workers=1, slots=1)
        print(cluster.server.pid, cluster.workers[0].pid, flush=True)
        time.sleep(600)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        server, worker = map(int, p.stdout.readline().split())
        assert alive(server) and alive(worker)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    deadline = time.monotonic() + 30
    while (alive(server) or alive(worker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker), "the worker outlived its interpreter"
    assert not alive(server), "the server outlived its interpreter"


def test_a_local_allocation_queue_starts_workers_of_this_package(tmp_path):
    with kestrel.LocalCluster(workers=0) as cluster, kestrel.Client(cluster) as client:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kestrel",
                "alloc",
                "add",
                "local",
                "--server-dir",
                str(cluster.directory),
                "--time-limit",
                "10m",
                "--max-workers",
                "1",
                "--worker-args",
                f"--slots 1 --python {sys.executable}",
            ],
            check=True,
            capture_output=True,
        )
        assert client.submit(pow, 3, 4).result(120) == 81
        assert len(client.workers()) == 1
