#!/usr/bin/env python3
"""Lineage (issue 13, benchmark 3): the worker holding intermediate files is killed mid-run;
the run completes, and what that cost is measured: producers run again, and the time.

    python3 bench/graphs_lineage.py [--runs 3] [--pairs 48] [--mb 1] [--workers 4]
                                    [--no-build] [--out bench/results/graphs_lineage.json]
    python3 bench/graphs_lineage.py --report bench/results/graphs_lineage.json

Each run starts a fresh server on 127.0.0.1 (a directory store in a temporary directory) and
`--workers` workers of one slot, each with its own cache directory. One job file of two
stages: `--pairs` producers each write an `--mb` MB file `mid/I` (`yes I | head -c ...`),
read by the consumer of the same id (`sleep 0.1; md5sum < {input:mid/I} > out/I.md5`); the
producers' files are therefore `local` (only in caches) and the consumers' outputs persisted.
Three cases, in rotated order per run:

  none      nothing is killed;
  kill      once every producer has finished and a quarter of the consumers have, the worker
            whose cache holds the most `mid/` files is SIGKILLed (the lost files' producers run
            again on the others, the consumers waiting for them);
  replicas  the same kill with `replicas = 2` on the producers: each file is copied to a
            second worker as its producer finishes, so the kill costs no re-run.

Each run checks every consumer's output against the md5 of what its producer writes. Reported
per case (medians over the runs): wall time of `submit --file --wait`, producers run again
(`server info`'s `intermediate_tasks_rerun`), tasks run in all (`attempts` summed), files in
the killed cache. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kbench.cluster import Cluster
from kbench.common import log
from kbench.procs import PROCS, cmd_error, run_cmd

REPO = Path(__file__).resolve().parent.parent
CASES = ("none", "kill", "replicas")


def job_file(pairs: int, mb: int, replicas: int) -> str:
    size = mb * 1024 * 1024
    extra = f"replicas = {replicas}\n" if replicas > 1 else ""
    return f"""
[[job]]
name = "produce"
array = "1-{pairs}"
outputs = ["mid/{{task}}"]
{extra}command = "sh -c 'mkdir -p mid && yes {{task}} | head -c {size} > mid/{{task}}'"

[[job]]
name = "consume"
array = "1-{pairs}"
inputs = ["mid/{{task}}"]
outputs = ["out/{{task}}.md5"]
command = "sh -c 'sleep 0.1; mkdir -p out && md5sum < {{input:mid/{{task}}}} > out/{{task}}.md5'"
"""


def expected_md5(task: int, mb: int) -> str:
    line = f"{task}\n".encode()
    size = mb * 1024 * 1024
    data = (line * (size // len(line) + 1))[:size]
    return hashlib.md5(data).hexdigest()


def k_json(c: Cluster, *args) -> dict:
    r = run_cmd(c.k(*args, "--output", "json"), timeout=60, cwd=c.dir)
    if r["rc"] != 0:
        raise RuntimeError(cmd_error("kestrel " + " ".join(map(str, args)), r))
    return json.loads(r["out"])


def mid_files(cache: Path) -> int:
    return sum(1 for p in cache.glob("files/*/mid/*") if p.is_file())


def one_run(kbin: str, root: Path, case: str, a: argparse.Namespace) -> dict:
    c = Cluster(kbin, root, f"lineage-{case}")
    try:
        return run_case(c, case, a)
    finally:
        c.close()


def run_case(c: Cluster, case: str, a: argparse.Namespace) -> dict:
    store = c.dir / "store"
    store.mkdir()
    # The server's store, so the job file needs none.
    log_f = c._log("server.log")
    argv = c.k("server", "start", "--host", "127.0.0.1", "--store", store)
    c.server = PROCS.start(argv, stdout=log_f, stderr=log_f, cwd=c.dir)
    wait_access(c)
    caches = [c.dir / f"cache-{i}" for i in range(a.workers)]
    for cache in caches:
        w = c.k("worker", "start", "--slots", 1, "--cache-dir", cache, "--cache-size", "2G")
        c.workers.append(PROCS.start(w, stdout=subprocess.DEVNULL, stderr=c._log("w.log")))
    deadline = time.monotonic() + 60
    while len(c.worker_list()) < a.workers:
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not connect")
        time.sleep(0.1)
    (c.dir / "stages.toml").write_text(job_file(a.pairs, a.mb, 2 if case == "replicas" else 1))
    t0 = time.perf_counter()
    sub = c.k("submit", "--file", "stages.toml", "--wait")
    run = PROCS.start(sub, stdout=subprocess.DEVNULL, stderr=c._log("submit.log"), cwd=c.dir)
    killed_files = 0
    if case != "none":
        # Every producer done and a quarter of the consumers: kill the richest cache.
        deadline = time.monotonic() + 600
        while True:
            if time.monotonic() > deadline or run.poll() is not None:
                raise RuntimeError(f"ended before the kill point: {c.log_tail('submit.log')}")
            done = [j["counts"]["finished"] for j in k_json(c, "job", "list")["jobs"]]
            if len(done) == 2 and done[0] == a.pairs and done[1] >= a.pairs // 4:
                break
            time.sleep(0.05)
        held = [mid_files(cache) for cache in caches]
        victim = max(range(a.workers), key=lambda i: held[i])
        killed_files = held[victim]
        os.killpg(c.workers[victim].pid, signal.SIGKILL)
        log(f"{case}: killed worker {victim}, its cache held {killed_files} mid/ files")
    rc = run.wait(timeout=1800)
    seconds = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{case}: submit --wait exited {rc}: {c.log_tail('submit.log')}")
    wrong = [
        i
        for i in range(1, a.pairs + 1)
        if (store / f"out/{i}.md5").read_text().split()[0] != expected_md5(i, a.mb)
    ]
    if wrong:
        raise RuntimeError(f"{case}: wrong outputs for consumers {wrong[:10]}")
    info = k_json(c, "server", "info")
    attempts = 0
    for job in (1, 2):
        rows = k_json(c, "task", "list", job, "--limit", a.pairs)["tasks"]
        attempts += sum(r["attempts"] for r in rows)
    return {
        "case": case,
        "seconds": seconds,
        "rerun": info.get("intermediate_tasks_rerun", 0),
        "attempts": attempts,
        "killed_files": killed_files,
        "outputs_ok": True,
    }


def wait_access(c: Cluster) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if json.loads((c.sdir / "access.json").read_text()).get("pid") == c.server.pid:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise RuntimeError("the server did not start")


def report(results: dict) -> str:
    a = results["args"]
    lines = [
        "## Lineage: a worker holding intermediates killed mid-run",
        "",
        (
            f"`bench/graphs_lineage.py`: {a['pairs']} producer -> consumer pairs through "
            f"{a['mb']} MB `local` files, {a['workers']} workers of one slot, medians of "
            f"{a['runs']} runs ({results['date']}). The worker whose cache holds the most "
            "intermediates is SIGKILLed once every producer and a quarter of the consumers "
            "have finished. Every run's outputs were checked against the producers' content."
        ),
        "",
        "| case | wall time (s) | producers run again | task runs in all | files in the killed cache |",
        "|---|---:|---:|---:|---:|",
    ]
    for case in CASES:
        rs = [r for r in results["runs"] if r["case"] == case]
        if not rs:
            continue

        def med(key, rs=rs):
            return statistics.median(r[key] for r in rs)

        lines.append(
            f"| {case} | {med('seconds'):.2f} | {med('rerun'):g} | {med('attempts'):g} "
            f"| {med('killed_files'):g} |"
        )
    lines += [
        "",
        (
            f"Without a kill, {2 * a['pairs']} tasks run. `kill`: the run completes; the lost "
            "files' producers ran again and the consumers that had not yet run waited for "
            "them. `replicas`: `replicas = 2` kept a second copy of each file on another "
            "worker, so the kill cost no re-run."
        ),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--pairs", type=int, default=48)
    p.add_argument("--mb", type=int, default=1)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--out", default=str(REPO / "bench/results/graphs_lineage.json"))
    p.add_argument("--report", metavar="JSON")
    a = p.parse_args()
    doc = REPO / "docs/benchmarks-graphs-lineage.md"
    if a.report:
        doc.write_text(report(json.loads(Path(a.report).read_text())))
        return 0
    if a.pairs < 4 or a.workers < 2 or a.runs < 1 or a.mb < 1:
        p.error("--pairs >= 4, --workers >= 2, --runs >= 1 and --mb >= 1")
    if not a.no_build:
        subprocess.run(
            ["cargo", "build", "--release", "-q", "-p", "kestrel-cli"], cwd=REPO, check=True
        )
    kbin = str(REPO / "target/release/kestrel")
    root = Path(tempfile.mkdtemp(prefix="kestrel-lineage-"))
    runs = []
    try:
        for n in range(a.runs):
            order = CASES[n % 3 :] + CASES[: n % 3]
            for case in order:
                r = one_run(kbin, root, case, a)
                log(f"run {n + 1} {case}: {r}")
                runs.append(r)
    finally:
        PROCS.stop_all()
    results = {
        "args": {k: v for k, v in vars(a).items() if k in ("runs", "pairs", "mb", "workers")},
        "date": time.strftime("%Y-%m-%d"),
        "runs": runs,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    doc.write_text(report(results))
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
