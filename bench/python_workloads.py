"""One engine's Python workloads for bench/python_futures.py, in a process of its own.

    PYTHON bench/python_workloads.py ENGINE WORKLOAD [--tasks N] [--slots S] ...

ENGINE is kestrel, dask, ray or parsl, imported from the interpreter running this script (the
Kestrel package's venv, or the peers' venv of ../shared/anchors/peers.py). WORKLOAD is:

  suite   on one fresh local cluster of S slots, in this order: `map` (N no-op calls through
          the engine's map, from the call to the last result), `latency` (--calls sequential
          `submit(noop).result()` round trips, each timed), `chain` (--links calls, each taking
          the previous one's future), and for kestrel `commands` (--commands `/bin/true` tasks
          from Python, `client.map_commands`) beside `cli` (the same tasks with `kestrel submit
          --array ... --wait` on the same cluster);
  stream  kestrel only: N items of a generator through `client.map`, each result read and
          dropped, with this process's peak RSS and the server's and worker's peak memory.
  value   on a fresh cluster of --value-workers workers of one slot: one call returns a
          --value-mb MB result, then --value-workers calls each take that future and digest the
          value (one on the worker holding it, the others on the other workers: Kestrel places
          them so, Dask is told to). Reports the seconds from the producer's end to the last
          consumer's, where each consumer ran, and the bytes through the server (Kestrel's own
          count, and for both the bytes the kernel counts on the scheduler process's TCP
          connections, `ss -tinp`). Dask's scheduler and workers run as processes of their
          own for that.

Prints one JSON object on its last line. Standard library and the engine only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def noop(x=None):
    return x


def inc(x):
    return x + 1


def now() -> float:
    return time.perf_counter()


def timed_calls(call, calls: int, warm: int = 100) -> dict:
    for _ in range(warm):
        call()
    us = []
    for _ in range(calls):
        t = now()
        call()
        us.append((now() - t) * 1e6)
    us.sort()
    return {
        "calls": calls,
        "median_us": round(statistics.median(us), 1),
        "p90_us": round(us[int(0.90 * (calls - 1))], 1),
        "p99_us": round(us[int(0.99 * (calls - 1))], 1),
        "max_us": round(us[-1], 1),
    }


def rate(n: int, seconds: float) -> dict:
    return {"tasks": n, "seconds": round(seconds, 3), "tasks_per_s": round(n / seconds, 1)}


def hwm_kib(pid: int) -> int | None:
    """A live process's peak resident memory (VmHWM), KiB."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def self_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ----- Kestrel --------------------------------------------------------------------------------


def kestrel_suite(a) -> dict:
    import kestrel

    out: dict = {"engine": "kestrel", "version": kestrel.__version__}
    with kestrel.LocalCluster(workers=1, slots=a.slots) as cluster:
        client = kestrel.Client(cluster)
        client.gather(client.map(noop, range(200)))
        t = now()
        results = client.gather(client.map(noop, range(a.tasks)))
        out["map"] = rate(a.tasks, now() - t)
        assert results[-1] == a.tasks - 1
        out["latency"] = timed_calls(lambda: client.submit(noop).result(), a.calls)
        out["chain"] = kestrel_chain(client, a.links)
        if a.commands:
            out["commands"], out["cli"] = kestrel_commands(client, cluster, a.commands)
        out["server_hwm_kib"] = hwm_kib(cluster.server.pid)
        client.close()
    return out


def kestrel_chain(client, links: int) -> dict:
    f = client.submit(inc, 0)
    for _ in range(20):
        f = client.submit(inc, f)
    f.result()
    t = now()
    f = client.submit(inc, 0)
    for _ in range(links - 1):
        f = client.submit(inc, f)
    assert f.result() == links
    s = now() - t
    return {"links": links, "seconds": round(s, 3), "ms_per_link": round(s * 1e3 / links, 3)}


def kestrel_commands(client, cluster, n: int) -> tuple[dict, dict]:
    """/bin/true from Python and from the CLI on the same cluster, Python first."""
    t = now()
    for f in client.map_commands(["/bin/true"] for _ in range(n)):
        f.result()
    py = rate(n, now() - t)
    cli = [sys.executable, "-m", "kestrel", "submit", "--server-dir", str(cluster.directory)]
    t = now()
    p = subprocess.run(
        [*cli, "--array", f"1-{n}", "--wait", "--", "/bin/true"],
        check=False,
        capture_output=True,
        text=True,
    )
    s = now() - t
    if p.returncode != 0:
        raise RuntimeError(f"kestrel submit failed ({p.returncode}): {p.stderr[-2000:]}")
    return py, rate(n, s)


def kestrel_stream(a) -> dict:
    import kestrel

    out: dict = {"engine": "kestrel", "version": kestrel.__version__}
    with kestrel.LocalCluster(workers=1, slots=a.slots) as cluster:
        client = kestrel.Client(cluster)
        before = self_rss_kib()
        t = now()
        items = (i for i in range(a.tasks))
        total = 0
        for value in client.map(noop, items).results():
            total += value
        s = now() - t
        assert total == a.tasks * (a.tasks - 1) // 2
        out["stream"] = {
            **rate(a.tasks, s),
            "client_rss_kib_before": before,
            "client_peak_rss_kib": self_rss_kib(),
            "server_hwm_kib": hwm_kib(cluster.server.pid),
            "worker_hwm_kib": hwm_kib(cluster.workers[0].pid),
            # The worker's Python runners (and its reaper, far smaller).
            "runner_hwm_kib": max(
                (hwm_kib(c) or 0 for c in children(cluster.workers[0].pid)), default=None
            ),
        }
        client.close()
    return out


# Which process is a task's worker: Kestrel calls functions in runners, children of their
# worker; Dask in its worker's own process. Set by `main`, pickled with the functions below.
WORKER_IS_PARENT = True


def worker_process() -> int:
    return os.getppid() if WORKER_IS_PARENT else os.getpid()


def make_value(mb: int) -> tuple:
    """A result of `mb` MB, with the worker process that made it."""
    return worker_process(), b"\x01" * (mb << 20)


def consume_value(made: tuple) -> tuple:
    """Where this ran, where the value was made, and the value's digest."""
    import hashlib

    producer, data = made
    return worker_process(), producer, len(data), hashlib.blake2b(data).hexdigest()


def socket_bytes(pid: int) -> int:
    """Bytes sent and received so far on the open TCP connections of process `pid`, as the
    kernel counts them (`ss -tinp`: tcp_info's bytes_sent and bytes_received): the same
    measure for any engine's server, whatever it counts itself."""
    out = subprocess.run(["ss", "-tinpH"], check=True, capture_output=True, text=True).stdout
    total, mine = 0, False
    for line in out.splitlines():
        if not line[:1].isspace():
            mine = f"pid={pid}," in line
            continue
        if mine:
            for key in ("bytes_sent", "bytes_received"):
                m = re.search(rf"\b{key}:(\d+)", line)
                if m:
                    total += int(m.group(1))
    return total


def value_summary(results: list, seconds: float, mb: int) -> dict:
    producer = results[0][1]
    digests = {r[3] for r in results}
    assert len(digests) == 1 and all(r[2] == mb << 20 for r in results), results
    return {
        "mb": mb,
        "consumers": len(results),
        "on_other_workers": sum(r[0] != producer for r in results),
        "consume_s": round(seconds, 3),
    }


def kestrel_value(a) -> dict:
    import kestrel

    out: dict = {"engine": "kestrel", "version": kestrel.__version__}
    with kestrel.LocalCluster(workers=a.value_workers, slots=1) as cluster:
        client = kestrel.Client(cluster)
        client.submit(noop).result()
        pid = cluster.server.pid
        own, sockets = sum(client.server_info()["traffic"].values()), socket_bytes(pid)
        made = client.submit(make_value, a.value_mb)
        made.exception()
        t = now()
        consumers = [client.submit(consume_value, made) for _ in range(a.value_workers)]
        results = client.gather(consumers)
        s = now() - t
        out["value"] = value_summary(results, s, a.value_mb)
        out["value"]["through_server_bytes"] = sum(client.server_info()["traffic"].values()) - own
        out["value"]["server_socket_bytes"] = socket_bytes(pid) - sockets
        out["value"]["result_nbytes"] = made.nbytes
        client.close()
    return out


# ----- Dask -----------------------------------------------------------------------------------


def dask_value(a) -> dict:
    """Dask's scheduler and workers as processes of their own, so that what passes through
    the scheduler can be read off its process."""
    import distributed
    from distributed import Client

    out: dict = {"engine": "dask", "version": distributed.__version__}
    tmp = Path(tempfile.mkdtemp(prefix="dask-value-"))
    sched_file = tmp / "scheduler.json"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_scheduler",
                "--scheduler-file",
                str(sched_file),
                "--host",
                "127.0.0.1",
                "--no-dashboard",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tmp,
        )
    ]
    try:
        while not sched_file.exists():
            time.sleep(0.05)
        for _ in range(a.value_workers):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "distributed.cli.dask_worker",
                        "--scheduler-file",
                        str(sched_file),
                        "--nthreads",
                        "1",
                        "--nworkers",
                        "1",
                        "--no-nanny",
                        "--no-dashboard",
                        "--host",
                        "127.0.0.1",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd=tmp,
                )
            )
        with Client(scheduler_file=str(sched_file)) as c:
            c.wait_for_workers(a.value_workers)
            c.submit(noop, pure=False).result()
            pid = procs[0].pid
            sockets = socket_bytes(pid)
            made = c.submit(make_value, a.value_mb, pure=False)
            made.exception()
            holder = next(iter(c.who_has([made])[made.key]))
            others = [w for w in c.scheduler_info()["workers"] if w != holder]
            t = now()
            # One where the value is, the rest on the other workers, as Kestrel places them.
            consumers = [c.submit(consume_value, made, pure=False, workers=[holder])] + [
                c.submit(consume_value, made, pure=False, workers=[w], allow_other_workers=False)
                for w in others
            ]
            results = c.gather(consumers)
            s = now() - t
            out["value"] = value_summary(results, s, a.value_mb)
            out["value"]["server_socket_bytes"] = socket_bytes(pid) - sockets
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    return out


def dask_suite(a) -> dict:
    import distributed
    from distributed import Client, LocalCluster

    out: dict = {"engine": "dask", "version": distributed.__version__}
    with (
        LocalCluster(
            n_workers=a.slots, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        c.gather(c.map(noop, range(200), key=[f"warm{i}" for i in range(200)]))
        t = now()
        results = c.gather(c.map(noop, range(a.peer_tasks)))
        out["map"] = rate(a.peer_tasks, now() - t)
        assert results[-1] == a.peer_tasks - 1
        out["latency"] = timed_calls(lambda: c.submit(noop, pure=False).result(), a.calls)
        f = c.submit(inc, 0, pure=False)
        t = now()
        for _ in range(a.links - 1):
            f = c.submit(inc, f, pure=False)
        assert f.result() == a.links
        s = now() - t
        out["chain"] = {"links": a.links, "seconds": round(s, 3), "ms_per_link": s * 1e3 / a.links}
    return out


# ----- Ray ------------------------------------------------------------------------------------


def ray_suite(a) -> dict:
    import ray

    out: dict = {"engine": "ray", "version": ray.__version__}
    ray.init(num_cpus=a.slots, include_dashboard=False, log_to_driver=False)
    try:
        rnoop = ray.remote(noop)
        rinc = ray.remote(inc)
        ray.get([rnoop.remote(i) for i in range(200)])
        t = now()
        results = ray.get([rnoop.remote(i) for i in range(a.peer_tasks)])
        out["map"] = rate(a.peer_tasks, now() - t)
        assert results[-1] == a.peer_tasks - 1
        out["latency"] = timed_calls(lambda: ray.get(rnoop.remote()), a.calls)
        f = rinc.remote(0)
        t = now()
        for _ in range(a.links - 1):
            f = rinc.remote(f)
        assert ray.get(f) == a.links
        s = now() - t
        out["chain"] = {"links": a.links, "seconds": round(s, 3), "ms_per_link": s * 1e3 / a.links}
    finally:
        ray.shutdown()
    return out


# ----- Parsl ----------------------------------------------------------------------------------


def parsl_suite(a) -> dict:
    import parsl
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    out: dict = {"engine": "parsl", "version": parsl.__version__}
    pnoop = parsl.python_app(noop)
    pinc = parsl.python_app(inc)
    run_dir = tempfile.mkdtemp(prefix="parsl-bench-")
    parsl.load(
        Config(
            executors=[
                HighThroughputExecutor(
                    max_workers_per_node=a.slots,
                    provider=LocalProvider(init_blocks=1, max_blocks=1),
                )
            ],
            run_dir=run_dir,
        )
    )
    try:
        [f.result() for f in [pnoop(i) for i in range(200)]]
        t = now()
        results = [f.result() for f in [pnoop(i) for i in range(a.peer_tasks)]]
        out["map"] = rate(a.peer_tasks, now() - t)
        assert results[-1] == a.peer_tasks - 1
        out["latency"] = timed_calls(lambda: pnoop().result(), a.calls)
        f = pinc(0)
        t = now()
        for _ in range(a.links - 1):
            f = pinc(f)
        assert f.result() == a.links
        s = now() - t
        out["chain"] = {"links": a.links, "seconds": round(s, 3), "ms_per_link": s * 1e3 / a.links}
    finally:
        parsl.dfk().cleanup()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("engine", choices=["kestrel", "dask", "ray", "parsl"])
    ap.add_argument("workload", choices=["suite", "stream", "value"])
    ap.add_argument("--tasks", type=int, default=100_000, help="kestrel's map, or stream items")
    ap.add_argument("--peer-tasks", type=int, default=10_000, help="a peer's map")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--links", type=int, default=1000)
    ap.add_argument("--commands", type=int, default=0)
    ap.add_argument("--value-mb", type=int, default=200)
    ap.add_argument("--value-workers", type=int, default=5)
    a = ap.parse_args()
    if a.workload == "stream":
        if a.engine != "kestrel":
            ap.error("stream is a kestrel workload")
        out = kestrel_stream(a)
    elif a.workload == "value":
        if a.engine not in ("kestrel", "dask"):
            ap.error("value is a kestrel and dask workload")
        global WORKER_IS_PARENT
        WORKER_IS_PARENT = a.engine == "kestrel"
        out = {"kestrel": kestrel_value, "dask": dask_value}[a.engine](a)
    else:
        out = {
            "kestrel": kestrel_suite,
            "dask": dask_suite,
            "ray": ray_suite,
            "parsl": parsl_suite,
        }[a.engine](a)
    out["client_peak_rss_kib"] = self_rss_kib()
    print(json.dumps(out), flush=True)
    # Peers' clusters leave threads behind that can hold the interpreter at exit.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
