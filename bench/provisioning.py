#!/usr/bin/env python3
"""Workers from the batch system (issue 14): Falkon's 18-stage workload on the Slurm test
cluster, with workers only from allocations, against a static allocation of every node and
against HyperQueue's autoalloc, in the shape of the dissertation's Tables 6-7.

    python3 bench/provisioning.py [--scale 1] [--runs 1] [--grid partial|full]
                                  [--only KEY,...] [--no-hq] [--no-build] [--no-lock]
                                  [--output table|json] [--out bench/results/provisioning.json]
    python3 bench/provisioning.py --report bench/results/provisioning.json   # only the doc
    python3 bench/provisioning.py --merge MORE.json    # add another run's configurations

The workload (`FALKON`): 18 stages of 1,000 tasks and 17,820 CPU-s, 60 s tasks except stages
8/9/10 (120/6/12 s); the dissertation gives the shape and the totals, not the widths, so the
widths are reconstructed (see `FALKON` and the doc). Scaled to the cluster: widths times
slots/32 (rounded up; 32 machines were Falkon's peak, 16 slots are ours), durations times
--scale (default 1: Falkon's own 60 s tasks, about 25 min a configuration). The idle timeouts
are Falkon's (15 s, 60 s, never) and are not scaled: at --scale 0.1 a 15 s timeout outlasts
two and a half 6 s stages, so no node can be given back between stages, and whole 4-CPU nodes
then waste about half of what the static allocation does whatever the provisioner (see
`floor_idle`); use a smaller scale only for trials. Stages run one after another: stage k+1 is submitted when `submit --wait` of stage k
returns. Tasks are `sleep`.

Configurations (one fresh server each, in its own temporary directory; `--only` picks some):
  static            one 4-node sbatch job started before the workload, `kestrel worker start
                    --slots 4` on each node with `srun`, canceled when the last stage ends
                    (Falkon-inf: provisioned beforehand, the wait not counted in the makespan)
  kestrel/P/T       `kestrel alloc add slurm --nodes 4 --max-workers 4 --acquire P
                    --idle-timeout T --worker-args "--slots 4" -- --partition=debug`
  hq/T              `hq alloc add slurm --max-worker-count 4 --cpus 4 --idle-timeout T
                    -- --partition=debug --exclusive` (1 node per allocation, HQ's default)
  --grid partial (default): static; P = one, additive, exponential, all at T = 15s; P = all at
  T = 60s and never; hq at 15s and 60s. --grid full: every P x T (15s, 60s, never), hq at all 3.

Measured per configuration: the makespan (first submit to the last stage's end); the CPU-s the
allocations held (Slurm's own start and end of each batch job times its CPUs, from
`squeue --states=all` polled every second for the jobs whose script lies under the run's
directory); the CPU-s of the tasks (each task's run time from `kestrel task list` /
`hq task list`); idle CPU-s = held - tasks, counted to the end of the last allocation (with
an idle timeout, the allocations are waited for until they go by themselves; with `never`
and static they are canceled when the last stage ends); allocations that ran; and the calls
to sbatch, squeue, scancel and scontrol of the server and everything it started (wrappers
first on its PATH that count, then exec the real command).

Holds /tmp/kestrel-slurm.lock (flock) from the first configuration to the last, so that other
users of the test cluster wait (--no-lock if the caller holds it). Writes the results as JSON
(--out), docs/benchmarks-provisioning.md (copied into docs/benchmarks.md) and
docs/provisioning.png (matplotlib from the benchmark venv, see bench/run.py). Prints a table
(or the JSON with --output json) on stdout; progress on stderr. Standard library only.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import datetime as dt
import fcntl
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

from kbench.cluster import Cluster
from kbench.common import DOC, REPO, RESULTS, T0, log
from kbench.machine import kestrel_copy, machine
from kbench.plots import plot_elsewhere
from kbench.procs import PROCS, cmd_error, json_docs, run_cmd
from kbench.report import splice_section

SHARED = REPO.parent / "shared"
HQ = SHARED / "anchors" / "bin" / "hq"
TEST_CLUSTER = REPO / "testsupport" / "slurm" / "test-cluster"
LOCK = Path("/tmp/kestrel-slurm.lock")
PARTITION = "debug"
TIME_LIMIT = "60m"  # of each allocation: longer than any configuration runs
PART_DOC = DOC.with_name("benchmarks-provisioning.md")
PNG = DOC.with_name("provisioning.png")
TITLE = "Workers from the batch system: Falkon's 18 stages on Slurm (issue 14)"
BATCH_CMDS = ("sbatch", "squeue", "scancel", "scontrol")

# Falkon's 18-stage workload (dissertation §5.3.2, Figure 31): (tasks, seconds per task).
# The text gives the shape and the totals, not the figure's numbers; these widths are a
# reconstruction that meets every stated fact: an exponential ramp (1..64), a drop at stage 8,
# a surge at 9 and 10, a drop at 11, a modest rise at 12, a linear decrease at 13-14, an
# exponential decrease to one task at 18; 1,000 tasks, 17,820 CPU-s, and 1,260 s ideal on 32
# machines (each stage's rounds of 32 tasks times its task length, summed).
FALKON = [
    (1, 60), (2, 60), (4, 60), (8, 60), (16, 60), (32, 60), (64, 60), (8, 120), (678, 6),
    (126, 12), (10, 60), (14, 60), (12, 60), (10, 60), (8, 60), (4, 60), (2, 60), (1, 60),
]  # fmt: skip
FALKON_MACHINES = 32
POLICIES = ["one", "additive", "exponential", "all"]
TIMEOUTS = ["15s", "60s", "never"]
HQ_NEVER = "24h"  # HQ's --idle-timeout has no `never`; a day outlives every run here
LIVE = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
    "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
}  # fmt: skip


def falkon_facts() -> dict:
    tasks = sum(n for n, _ in FALKON)
    cpu = sum(n * s for n, s in FALKON)
    ideal = sum(math.ceil(n / FALKON_MACHINES) * s for n, s in FALKON)
    assert (tasks, cpu, ideal) == (1000, 17820, 1260), (tasks, cpu, ideal)
    return {"tasks": tasks, "cpu_s": cpu, "ideal_s_on_32": ideal}


def workload(scale: float, slots: int) -> list[dict]:
    """The stages scaled to `slots` task slots (widths) and by `scale` (durations)."""
    out = []
    for i, (n, s) in enumerate(FALKON, 1):
        width = max(1, math.ceil(n * slots / FALKON_MACHINES))
        out.append({"stage": i, "falkon_tasks": n, "falkon_s": s, "tasks": width, "s": s * scale})
    return out


def ideal(stages: list[dict], slots: int) -> float:
    return sum(math.ceil(st["tasks"] / slots) * st["s"] for st in stages)


def floor_idle(stages: list[dict], nodes: int, cpus: int) -> float:
    """The CPU-s that whole nodes waste however they are provisioned: held at each stage are
    only the nodes that stage uses, for its rounds, with no wait for nodes and no idle
    timeout (an oracle); what its tasks leave of those nodes' CPUs is idle."""
    idle = 0.0
    for st in stages:
        used = min(nodes, math.ceil(st["tasks"] / cpus))
        rounds = math.ceil(st["tasks"] / (used * cpus))
        idle += (used * cpus * rounds - st["tasks"]) * st["s"]
    return idle


def configs(grid: str, hq: bool) -> list[dict]:
    """The configurations of a grid, in the order they run."""
    out = [{"key": "static", "system": "kestrel", "acquire": "static", "idle": "never"}]
    if grid == "full":
        pairs = [(p, t) for t in TIMEOUTS for p in POLICIES]
        hq_t = TIMEOUTS
    else:
        pairs = [(p, "15s") for p in POLICIES] + [("all", "60s"), ("all", "never")]
        hq_t = TIMEOUTS[:2]
    out += [
        {"key": f"kestrel/{p}/{t}", "system": "kestrel", "acquire": p, "idle": t} for p, t in pairs
    ]
    if hq:
        out += [{"key": f"hq/{t}", "system": "hq", "acquire": "hq", "idle": t} for t in hq_t]
    return out


# ----- the batch system: counting its calls, watching our jobs ---------------------------------


class Calls:
    """sbatch/squeue/scancel/scontrol wrappers in `d`/bin that log each call to `d`/calls.log
    and exec the real command: first on the PATH of the server under test (and so of the
    batch jobs it submits, which inherit it)."""

    def __init__(self, d: Path) -> None:
        self.bin = d / "bin"
        self.log = d / "calls.log"
        self.bin.mkdir(parents=True)
        self.log.touch()
        for name in BATCH_CMDS:
            real = shutil.which(name)
            if not real:
                raise RuntimeError(f"{name} is not on PATH: is Slurm's client installed?")
            w = self.bin / name
            w.write_text(
                "#!/bin/sh\n"
                f"printf '%s\\t%s\\n' {name} \"$*\" >> '{self.log}'\n"
                f'exec {real} "$@"\n'
            )
            w.chmod(0o755)

    def env(self, tmp: Path) -> dict:
        """The server's environment: the wrappers first, and its scratch files (HQ's trial
        allocation) in `tmp`, under the run's directory, where the job watch looks."""
        tmp.mkdir(exist_ok=True)
        return dict(os.environ, PATH=f"{self.bin}:{os.environ['PATH']}", TMPDIR=str(tmp))

    def counts(self) -> dict:
        c = collections.Counter(ln.split("\t", 1)[0] for ln in self.log.read_text().splitlines())
        return {name: c.get(name, 0) for name in BATCH_CMDS}

    def lines(self) -> list[str]:
        """Every call but squeue's (one a tick; the first three kept, as samples)."""
        lines = self.log.read_text().splitlines()
        q = [ln for ln in lines if ln.startswith("squeue")]
        return [ln for ln in lines if not ln.startswith("squeue")] + q[:3]


def slurm_time(text: str) -> float | None:
    """Epoch seconds of squeue's local `%S`/`%e` (None for N/A, Unknown, None)."""
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class JobWatch(threading.Thread):
    """`squeue --states=all` every second (the real one, not counted): the batch jobs whose
    script lies under `prefix`, with Slurm's start, end, CPUs and state."""

    FMT = "%i|%T|%S|%e|%C|%D|%o"

    def __init__(self, prefix: Path) -> None:
        super().__init__(daemon=True)
        self.prefix = str(prefix)
        self.jobs: dict[str, dict] = {}
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.errors = 0
        self.others: dict[str, str] = {}

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.halt.set()
        self.join(10)
        self.poll()

    def run(self) -> None:
        while not self.halt.wait(1.0):
            self.poll()

    def poll(self) -> None:
        r = run_cmd(["/usr/bin/squeue", "--states=all", "-h", "-o", self.FMT], timeout=20)
        if r["rc"] != 0:
            self.errors += 1
            return
        now = time.time()
        with self.lock:
            for line in r["out"].splitlines():
                f = line.split("|", 6)
                if len(f) < 7:
                    continue
                if not f[6].startswith(self.prefix):
                    if f[1] in LIVE:  # someone else's job beside ours
                        self.others.setdefault(f[0], f"{f[0]} {f[1]} {f[6]}")
                    continue
                j = self.jobs.setdefault(f[0], {"id": f[0], "first_seen": now, "script": f[6]})
                j.update(state=f[1], cpus=int(f[4]), nodes=int(f[5]), last_seen=now)
                j["start"], j["end"] = slurm_time(f[2]), slurm_time(f[3])
                if f[1] == "RUNNING":
                    j["ran"] = True

    def live(self) -> list[str]:
        with self.lock:
            return [i for i, j in self.jobs.items() if j["state"] in LIVE]

    def snapshot(self) -> list[dict]:
        """Every job seen, with the CPU-s it held (CPUs x Slurm's end - start, 0 for one that
        never started: a held trial allocation, one canceled while queued)."""
        out = []
        with self.lock:
            for j in self.jobs.values():
                j = dict(j)
                s, e = j.get("start"), j.get("end")
                if j["state"] in LIVE:  # still there: held until now
                    e = time.time()
                ran = bool(s and e and e > s and (j.get("ran") or j["state"] != "CANCELLED"))
                j["held_s"] = (e - s) if ran else 0.0
                j["cpu_s"] = j["held_s"] * j["cpus"]
                j["ran"] = ran
                out.append(j)
        return sorted(out, key=lambda j: int(j["id"].split("_")[0]))


def others_live(prefix: str) -> list[str]:
    """Jobs in the test cluster that are not ours and hold or wait for nodes."""
    r = run_cmd(["/usr/bin/squeue", "-h", "-o", "%i|%T|%o"], timeout=20)
    out = []
    for line in r["out"].splitlines():
        f = line.split("|", 2)
        if len(f) == 3 and not f[2].startswith(prefix):
            out.append(f"{f[0]} {f[1]} {f[2]}")
    return out


def wait_quiet_cluster(prefix: str, limit: float = 300) -> list[str]:
    """Waits (up to `limit` s) until no one else's job is in the cluster; returns those left."""
    t = time.monotonic()
    left = others_live(prefix)
    if left:
        log(f"  other jobs in the cluster ({len(left)}): waiting up to {limit:.0f} s for them")
    while left and time.monotonic() - t < limit:
        time.sleep(5)
        left = others_live(prefix)
    return left


def wait_gone(watch: JobWatch, limit: float) -> bool:
    """Waits until none of the watched jobs is live; False if some still are after `limit`."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        watch.poll()
        if not watch.live():
            return True
        time.sleep(1)
    return not watch.live()


def cancel_ours(watch: JobWatch) -> list[str]:
    """Cancels our jobs still live (by id, the real scancel: not counted)."""
    ids = watch.live()
    if ids:
        run_cmd(["/usr/bin/scancel", *ids], timeout=30)
    return ids


def leave_nothing(watch: JobWatch, out: dict) -> None:
    """After a configuration, failed or not: none of its batch jobs stays in the cluster."""
    if not wait_gone(watch, 30):
        out["notes"].append(f"batch jobs {cancel_ours(watch)} still live at the end: canceled")
        wait_gone(watch, 30)
    out["others"] = sorted(watch.others.values())


def seconds(text: str) -> float | None:
    """15s / 60s / never -> seconds."""
    return None if text == "never" else float(text.rstrip("s"))


# ----- one configuration -----------------------------------------------------------------------


def stage_args(st: dict) -> tuple[int, list[str]]:
    return st["tasks"], ["sleep", f"{st['s']:g}"]


def kestrel_config(kbin: str, root: Path, cfg: dict, stages: list[dict], nodes: int, cpus: int):
    name = cfg["key"].replace("/", "-")
    d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    calls = Calls(d / "calls")
    out: dict = {"notes": []}
    with JobWatch(d) as watch:
        try:
            _kestrel_run(kbin, d, cfg, stages, nodes, cpus, calls, watch, out)
        finally:
            leave_nothing(watch, out)
    out["calls"] = calls.counts()
    out["call_lines"] = calls.lines()
    out["jobs"] = watch.snapshot()
    return out


def _kestrel_run(kbin, d, cfg, stages, nodes, cpus, calls, watch, out) -> None:
    with Cluster(kbin, d, "k", env=calls.env(d / "tmp")) as c:
        out["server_dir"] = str(c.sdir)
        static_job = None
        queue = None
        if cfg["acquire"] == "static":
            static_job = start_static(c, calls, nodes, cpus)
        else:
            argv = c.k(
                "alloc", "add", "slurm", "--time-limit", TIME_LIMIT, "--nodes", nodes,
                "--max-workers", nodes, "--idle-timeout", cfg["idle"], "--acquire",
                cfg["acquire"], "--worker-args", f"--slots {cpus}", "--output", "json",
            ) + ["--", f"--partition={PARTITION}"]  # fmt: skip
            r = run_cmd(argv, timeout=120, cwd=c.dir)
            if r["rc"] != 0:
                raise RuntimeError(cmd_error("kestrel alloc add", r))
            queue = json_docs(r["out"])[-1]["queue"]
        out.update(
            drive(stages, lambda st: c.submit([*_flags(st), stage_args(st)[1]], st["tasks"]))
        )
        t_end = time.monotonic()
        # Let the allocations go: by themselves after the idle timeout, else by us.
        idle = seconds(cfg["idle"])
        if static_job:
            run_cmd(["scancel", static_job], timeout=30, env=calls.env(d / "tmp"))
        elif idle is None:
            r = run_cmd(c.k("alloc", "remove", queue, "--force"), timeout=60, cwd=c.dir)
            if r["rc"] != 0:
                out["notes"].append(cmd_error("kestrel alloc remove --force", r))
        elif not wait_gone(watch, idle + 120):
            live = watch.live()
            out["notes"].append(
                f"allocations still live {idle + 120:.0f} s after the last stage "
                f"(batch ids {', '.join(live)}): removed with `alloc remove --force`"
            )
            run_cmd(c.k("alloc", "remove", queue, "--force"), timeout=60, cwd=c.dir)
        if not wait_gone(watch, 90):
            out["notes"].append(f"batch jobs {cancel_ours(watch)} still live: canceled by us")
        out["release_s"] = time.monotonic() - t_end
        out["task_cpu_s"], out["task_runs"] = kestrel_task_cpu(c, out.pop("task_jobs"))
        out["alloc_list"], out["alloc_list_settled_s"] = settled_alloc_list(c)
        if out["alloc_list_settled_s"] is None:
            out["notes"].append(
                "`kestrel alloc list` still shows allocations not ended 15 s after Slurm ended "
                "them all: "
                + ", ".join(
                    f"{a['id']} ({a['batch_id']}) {a['state']}"
                    for q in out["alloc_list"]
                    for a in q["allocations"]
                    if a["state"] in K_LIVE
                )
            )
        keep_logs(c.dir, cfg["key"])


K_LIVE = {"submitting", "queued", "running", "draining", "canceling"}


def settled_alloc_list(c: Cluster) -> tuple[list, float | None]:
    """`kestrel alloc list` once every allocation in it has ended (Slurm has ended them all),
    and how long after that it took; None if some still show as not ended after 15 s."""
    t = time.monotonic()
    while True:
        r = run_cmd(c.k("alloc", "list", "--output", "json"), timeout=60, cwd=c.dir)
        if r["rc"] != 0:
            raise RuntimeError(cmd_error("kestrel alloc list", r))
        queues = json.loads(r["out"])["queues"]
        live = [a for q in queues for a in q["allocations"] if a["state"] in K_LIVE]
        waited = time.monotonic() - t
        if not live:
            return queues, waited
        if waited > 15:
            return queues, None
        time.sleep(0.5)


def _flags(st: dict) -> list[str]:
    return ["--array", f"1-{st['tasks']}", "--stdout", "none", "--stderr", "none"]


def start_static(c: Cluster, calls: Calls, nodes: int, cpus: int) -> str:
    """The baseline: one batch job of every node, a worker on each (started with srun and
    waited for, as Kestrel's pilots do), up before the workload starts. Returns its id."""
    script = c.dir / "static.sh"
    script.write_text(
        "#!/bin/sh\n"
        "#SBATCH --job-name=kbench-static\n"
        f"#SBATCH --nodes={nodes}\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --exclusive\n"
        f"#SBATCH --time={TIME_LIMIT.rstrip('m')}:00\n"
        f"#SBATCH --output={c.dir}/static.out\n"
        f"#SBATCH --error={c.dir}/static.err\n"
        f"srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 "
        f"{c.kbin} worker start --server-dir {c.sdir} --slots {cpus} &\n"
        "wait $!\n"
    )
    r = run_cmd(
        ["sbatch", "--parsable", f"--partition={PARTITION}", script],
        timeout=60,
        env=calls.env(c.dir / "tmp"),
        cwd=c.dir,
    )
    if r["rc"] != 0:
        raise RuntimeError(cmd_error("sbatch (static)", r))
    job = r["out"].strip().split(";")[0]
    deadline = time.monotonic() + 120
    while len(c.worker_list()) < nodes:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the static job's {nodes} workers did not all connect in 120 s")
        time.sleep(0.5)
    return job


def drive(stages: list[dict], submit) -> dict:
    """Runs the stages one after another (`submit(stage)` returns when the stage is done):
    the makespan and each stage's time."""
    t0, e0 = time.monotonic(), time.time()
    per, jobs = [], []
    for st in stages:
        s = submit(st)
        jobs.append(s["jobs"][0] if isinstance(s.get("jobs"), list) else s.get("job"))
        per.append(round(s["seconds"], 3))
    return {
        "makespan_s": time.monotonic() - t0,
        "start_epoch": e0,
        "end_epoch": time.time(),
        "stage_s": per,
        "task_jobs": jobs,
    }


def kestrel_task_cpu(c: Cluster, jobs: list[int]) -> tuple[float, int]:
    """The tasks' run time (CPU-s of their slots) from `kestrel task list`."""
    total, runs = 0.0, 0
    for j in jobs:
        argv = c.k("task", "list", j, "--limit", "1000000", "--output", "json")
        r = run_cmd(argv, timeout=120, cwd=c.dir)
        if r["rc"] != 0:
            raise RuntimeError(cmd_error("kestrel task list", r))
        for t in json.loads(r["out"])["tasks"]:
            if t.get("state") != "finished":
                raise RuntimeError(f"job {j} task {t['id']} is {t.get('state')}")
            total += (t.get("run_us") or 0) / 1e6
            runs += t.get("attempts") or 1
    return total, runs


def keep_logs(d: Path, key: str) -> None:
    """The run's server log and pilot outputs, kept under bench/results/ (git-ignored)."""
    dst = RESULTS / "provisioning-logs" / key.replace("/", "-")
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in d.rglob("*"):
        kept = (".log", ".out", ".err", ".sh", ".stderr", ".stdout")
        if f.is_file() and f.suffix in kept and f.stat().st_size < 20_000_000:
            rel = f.relative_to(d)
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dst / rel)


class HqServer:
    """`hq server start` in its own directory, with the counting wrappers on its PATH."""

    def __init__(self, d: Path, env: dict) -> None:
        self.d, self.sd = d, d / "hq-server"
        self.log = open(d / "server.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = PROCS.start(
            [str(HQ), "--server-dir", str(self.sd), "server", "start"],
            stdout=self.log,
            stderr=self.log,
            cwd=d,
            env=env,
        )
        deadline = time.monotonic() + 30
        while not list(self.sd.glob("*/access.json")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"hq server did not start: {(d / 'server.log').read_text()}")
            time.sleep(0.1)

    def cli(self, *args, timeout: float = 3600) -> str:
        argv = [str(HQ), "--server-dir", str(self.sd), *[str(a) for a in args]]
        r = run_cmd(argv, timeout=timeout, cwd=self.d)
        if r["rc"] != 0:
            raise RuntimeError(cmd_error(f"hq {args[0]} {args[1] if len(args) > 1 else ''}", r))
        return r["out"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            run_cmd([str(HQ), "--server-dir", str(self.sd), "server", "stop"], timeout=30)
        PROCS.stop(self.proc, grace=10)
        self.log.close()


def hq_config(root: Path, cfg: dict, stages: list[dict], nodes: int, cpus: int) -> dict:
    d = Path(tempfile.mkdtemp(prefix=f"hq-{cfg['idle']}-", dir=root))
    calls = Calls(d / "calls")
    idle = seconds(cfg["idle"])
    out: dict = {"notes": []}
    with JobWatch(d) as watch:
        hq = HqServer(d, calls.env(d / "tmp"))
        try:
            hq.cli(
                "alloc", "add", "slurm", "--time-limit", TIME_LIMIT, "--idle-timeout",
                cfg["idle"] if idle is not None else HQ_NEVER, "--max-worker-count", nodes,
                "--cpus", cpus, "--", f"--partition={PARTITION}", "--exclusive",
            )  # fmt: skip

            def submit(st: dict) -> dict:
                t = time.perf_counter()
                text = hq.cli(
                    "submit", "--output-mode", "json", *_flags(st), "--wait", "--",
                    *stage_args(st)[1],
                )  # fmt: skip
                return {"seconds": time.perf_counter() - t, "job": json_docs(text)[0]["id"]}

            out.update(drive(stages, submit))
            t_end = time.monotonic()
            if idle is None:
                hq.cli("alloc", "remove", "1", "--force")
            elif not wait_gone(watch, idle + 120):
                out["notes"].append(
                    f"allocations still live {idle + 120:.0f} s after the last stage: "
                    "removed with `hq alloc remove --force`"
                )
                hq.cli("alloc", "remove", "1", "--force")
            if not wait_gone(watch, 90):
                out["notes"].append(f"batch jobs {cancel_ours(watch)} still live: canceled by us")
            out["release_s"] = time.monotonic() - t_end
            total = 0.0
            tasks = json.loads(hq.cli("task", "list", f"1-{len(stages)}", "--output-mode", "json"))
            runs = 0
            for ts in tasks.values():
                for t in ts:
                    if t["state"] != "finished":
                        raise RuntimeError(f"hq task {t['id']} is {t['state']}")
                    a = dt.datetime.fromisoformat(t["started_at"])
                    b = dt.datetime.fromisoformat(t["finished_at"])
                    total += (b - a).total_seconds()
                    runs += 1
            out["task_cpu_s"], out["task_runs"] = total, runs
            try:
                out["alloc_list"] = json.loads(
                    hq.cli("alloc", "info", "1", "--output-mode", "json")
                )
            except RuntimeError as e:  # the queue is gone after `alloc remove`
                out["alloc_list"] = str(e)[:300]
        finally:
            hq.stop()
            keep_logs(d, cfg["key"])
            leave_nothing(watch, out)
    out["calls"] = calls.counts()
    out["call_lines"] = calls.lines()
    out["jobs"] = watch.snapshot()
    return out


def measure(kbin: str, root: Path, cfg: dict, stages: list[dict], nodes: int, cpus: int):
    """One run of one configuration, its figures derived."""
    left = wait_quiet_cluster(str(root))
    if cfg["system"] == "hq":
        s = hq_config(root, cfg, stages, nodes, cpus)
    else:
        s = kestrel_config(kbin, root, cfg, stages, nodes, cpus)
    if left:
        s["notes"].append(f"other jobs in the cluster at the start: {left}")
    if s.get("others"):
        s["notes"].append(f"other users' jobs ran in the cluster meanwhile: {s['others']}")
    ran = [j for j in s["jobs"] if j["ran"]]
    s["allocations"] = len(ran)
    s["submitted"] = len(s["jobs"])
    s["alloc_cpu_s"] = sum(j["cpu_s"] for j in ran)
    s["idle_cpu_s"] = s["alloc_cpu_s"] - s["task_cpu_s"]
    # Held after the last stage ended (the idle timeout's tail, or the time to cancel).
    s["tail_cpu_s"] = sum(
        j["cpus"] * max(0.0, j["start"] + j["held_s"] - s["end_epoch"]) for j in ran
    )
    late = [j for j in ran if j["start"] > s["end_epoch"]]
    if late:
        s["notes"].append(
            f"{len(late)} allocation(s) started after the last stage had ended (batch ids "
            f"{', '.join(j['id'] for j in late)}), holding {sum(j['cpu_s'] for j in late):.0f} "
            "CPU-s for no work"
        )
    s["late_allocations"] = len(late)
    # How often squeue was asked while this configuration had allocations.
    span = max((j["start"] + j["held_s"] for j in ran), default=s["end_epoch"]) - s["start_epoch"]
    s["squeue_per_s"] = s["calls"]["squeue"] / span if span > 0 else None
    s["utilization"] = s["task_cpu_s"] / s["alloc_cpu_s"] if s["alloc_cpu_s"] else None
    s["first_alloc_wait_s"] = (min(j["start"] for j in ran) - s["start_epoch"]) if ran else None
    return s


# ----- figures, goals, table -------------------------------------------------------------------


def median_of(samples: list[dict], key: str) -> float | None:
    vals = [s[key] for s in samples if "error" not in s and s.get(key) is not None]
    return statistics.median(vals) if vals else None


def summarize(res: dict) -> None:
    """Each configuration's medians, relative to static; the goals."""
    static = next((c for c in res["configs"] if c["key"] == "static"), None)
    sm = static and median_of(static["samples"], "makespan_s")
    si = static and median_of(static["samples"], "idle_cpu_s")
    for c in res["configs"]:
        ok = [s for s in c["samples"] if "error" not in s]
        m = c["median"] = {
            k: median_of(ok, k)
            for k in ("makespan_s", "idle_cpu_s", "alloc_cpu_s", "task_cpu_s", "tail_cpu_s",
                      "allocations", "utilization")
        }  # fmt: skip
        for cmd in BATCH_CMDS:
            m[cmd] = median_of([s["calls"] for s in ok], cmd)
        m["batch_calls"] = sum(m[x] or 0 for x in ("sbatch", "squeue", "scancel", "scontrol"))
        m["vs_static_makespan"] = m["makespan_s"] / sm if sm and m["makespan_s"] else None
        m["vs_static_idle"] = m["idle_cpu_s"] / si if si and m["idle_cpu_s"] is not None else None
        c["errors"] = [s["error"] for s in c["samples"] if "error" in s]
    goals = []
    for c in res["configs"]:
        m = c["median"]
        if c["system"] != "kestrel" or c["key"] == "static" or m["vs_static_makespan"] is None:
            continue
        goals.append({
            "goal": "static",
            "config": c["key"],
            "makespan_ok": m["vs_static_makespan"] <= 1.15,
            "idle_ok": m["vs_static_idle"] <= 0.30,
            "met": m["vs_static_makespan"] <= 1.15 and m["vs_static_idle"] <= 0.30,
        })  # fmt: skip
        hq = next((h for h in res["configs"] if h["key"] == f"hq/{c['idle']}"), None)
        if hq and hq["median"]["idle_cpu_s"] is not None:
            h = hq["median"]
            goals.append({
                "goal": "hq",
                "config": c["key"],
                "against": hq["key"],
                "idle_ok": m["idle_cpu_s"] < h["idle_cpu_s"],
                "calls_ok": m["batch_calls"] < h["batch_calls"],
                "met": m["idle_cpu_s"] < h["idle_cpu_s"] and m["batch_calls"] < h["batch_calls"],
            })  # fmt: skip
    res["goals"] = goals


def label(c: dict) -> str:
    if c["key"] == "static":
        return "static (4 nodes, whole run)"
    if c["system"] == "hq":
        t = c["idle"] if c["idle"] != "never" else f"never ({HQ_NEVER})"
        return f"HyperQueue, idle {t}"
    return f"Kestrel {c['acquire']}, idle {c['idle']}"


def _f(x: float | None, fmt: str = "{:,.0f}") -> str:
    return "—" if x is None else fmt.format(x)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def table_rows(res: dict) -> list[list[str]]:
    rows = []
    for c in res["configs"]:
        m = c["median"]
        if m["makespan_s"] is None:
            rows.append([label(c), "failed"] + [""] * (len(HEAD) - 2))
            continue
        rows.append(
            [
                label(c),
                _f(m["makespan_s"], "{:,.1f}"),
                _pct(m["vs_static_makespan"]),
                _f(m["idle_cpu_s"]),
                _pct(m["vs_static_idle"]),
                _f(m["tail_cpu_s"]),
                _f(m["allocations"]),
                *(_f(m[cmd]) for cmd in BATCH_CMDS),
            ]
        )
    return rows


HEAD = [
    "config", "makespan s", "vs static", "idle CPU-s", "vs static idle", "of it after the end",
    "allocations", "sbatch", "squeue", "scancel", "scontrol",
]  # fmt: skip


def text_table(res: dict) -> str:
    rows = [HEAD, *table_rows(res)]
    w = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join(x.ljust(w[i]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(r)))
        if k == 0:
            lines.append("  ".join("-" * x for x in w))
    return "\n".join(lines)


def md_table(res: dict) -> list[str]:
    out = ["| " + " | ".join(HEAD) + " |", "|---" + "|---:" * (len(HEAD) - 1) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in table_rows(res)]
    return out


# ----- the doc and the plot --------------------------------------------------------------------


def write_doc(res: dict) -> None:
    L: list[str] = []
    a = L.append
    w = res["workload"]
    cl = res["cluster"]
    a(f"# {TITLE}\n")
    built = (
        f"{len(res['parts'])} invocations, kestrel at the commits below"
        if res.get("parts")
        else f"{res['kestrel'].get('version', 'kestrel ?')} at {res['kestrel'].get('commit', '?')}"
        f"{' with uncommitted changes' if res['kestrel'].get('dirty') else ''}"
    )
    a(
        f"Generated by `bench/provisioning.py` ({res['date']}, {built}; "
        f"{res.get('hq_version') or 'hq'}), in {res['elapsed_s'] / 60:.0f} min, on "
        f"`testsupport/slurm/test-cluster`: Slurm {res.get('slurm', '?')}, {cl['nodes']} emulated "
        f"nodes of {cl['cpus']} CPUs (all on this {res['machine']['nproc']}-core machine), "
        f"partition `{PARTITION}`. {res['runs']} run(s) of each configuration; medians shown.\n"
    )
    a("```sh\n" + res["command"] + "\n```\n")
    for i, p in enumerate(res.get("parts") or []):
        k = p.get("kestrel") or {}
        a(
            f"{'First' if i == 0 else 'Then'} `{p['command']}` ({p['date']}, kestrel at "
            f"{k.get('commit', '?')}, {p['elapsed_s'] / 60:.0f} min"
            f"{', cut off before its end' if p['cut_off'] else ''}) measured "
            + ", ".join(f"`{c}`" for c in p["configs"])
            + "."
        )
    if res.get("parts"):
        a(
            "\nThe invocations ran the same workload on the same cluster, merged with "
            "`--merge`; the comparisons below are across them, not within one run.\n"
        )
    a("### The workload\n")
    f = res["falkon"]
    a(
        f"Falkon's synthetic 18-stage workload (dissertation §5.3.2, Figure 31): "
        f"{f['tasks']:,} tasks, {f['cpu_s']:,} CPU-s, {f['ideal_s_on_32']:,} s ideal on "
        f"{FALKON_MACHINES} machines; tasks of 60 s except stages 8, 9 and 10 (120, 6 and 12 s). "
        "The text gives its shape and these totals but not the figure's widths, so the widths "
        "below are **reconstructed, not Falkon's**: a doubling ramp 1…64 (stages 1–7), a drop "
        "to 8 at stage 8, a surge at 9–10, a drop at 11, a modest rise at 12, a linear "
        "decrease at 13–14 continued to 8 at 15, then halving to 1 task at 18; stages 9 and 10 "
        "(678 and 126 tasks) are what is left once the others are chosen, so that all three "
        "totals hold exactly (tasks, CPU-s, and the ideal time: each stage's rounds of 32 tasks "
        "times its task length, summed). "
        f"Scaled to the cluster: widths × {cl['slots']}/{FALKON_MACHINES} rounded up (the peak "
        f"fills the {cl['slots']} slots as 32 tasks filled Falkon's 32 machines), durations × "
        f"{res['scale']:g}: **{w['tasks']} tasks, {w['cpu_s']:,.1f} CPU-s, "
        f"{w['ideal_s']:,.1f} s ideal on {cl['slots']} slots**. Each stage is submitted when "
        "the one before has ended (`submit --wait`, then the next); tasks are `sleep`.\n"
    )
    a("| stage | " + " | ".join(str(s["stage"]) for s in w["stages"]) + " |")
    a("|---" + "|---:" * len(w["stages"]) + "|")
    a("| Falkon tasks | " + " | ".join(str(s["falkon_tasks"]) for s in w["stages"]) + " |")
    a("| Falkon s/task | " + " | ".join(str(s["falkon_s"]) for s in w["stages"]) + " |")
    a("| here: tasks | " + " | ".join(str(s["tasks"]) for s in w["stages"]) + " |")
    a("| here: s/task | " + " | ".join(f"{s['s']:g}" for s in w["stages"]) + " |")
    a("")
    a("### Results\n")
    a(
        "Makespan: first submission to the end of the last stage (the static allocation is up "
        "before, as Falkon-∞'s was). Idle CPU-s: the CPU-s Slurm's allocations held (each batch "
        "job's CPUs × its end − start, Slurm's own times) minus the tasks' run times; counted "
        "to the end of the last allocation, so an idle timeout's tail after the last stage is "
        "in it (the column beside it shows how much), and with `never` and static the "
        "allocations are canceled as soon as the last stage ends. Allocations: batch jobs that "
        "ran (not the test allocation of `alloc add`: Kestrel's is an `sbatch --test-only`, "
        "which takes no job, HyperQueue's a held job that it cancels). Calls: every `sbatch`, "
        "`squeue`, `scancel` and `scontrol` of the server and of what it started, the test "
        "allocation of `alloc add` included (static: the benchmark's own sbatch and scancel).\n"
    )
    L.extend(md_table(res))
    a("")
    floor = w.get("floor_idle_cpu_s")
    static = next((c for c in res["configs"] if c["key"] == "static"), None)
    si = static and static["median"]["idle_cpu_s"]
    if floor is not None:
        a(
            f"The floor: whole nodes of {cl['cpus']} CPUs waste **{floor:,.0f} CPU-s** however "
            "they are provisioned. That is what an oracle wastes that holds, at each stage, only "
            "the nodes the stage uses, for its rounds, with no wait for nodes and no idle "
            "timeout: a stage of 5 tasks leaves 3 CPUs of its second node idle"
            + (f"; {floor / si:.0%} of the static allocation's idle CPU-s" if si else "")
            + ".\n"
        )
    call_lines(res, a)
    a("![makespan and idle CPU-seconds per configuration](provisioning.png)\n")
    a(
        f"{res['runs']} run(s) of each configuration. Slurm gives start and end times to the "
        "second, so each allocation's CPU-s are exact to about ± its CPUs (4 per node): "
        "differences of a few percent in idle CPU-s between configurations are within that "
        "resolution and the noise of a single run.\n"
    )
    stage_lines(res, a)
    a("### Goals (issue 14)\n")
    goal_lines(res, a)
    notes = [
        (c["key"], n) for c in res["configs"] for s in c["samples"] for n in s.get("notes", [])
    ]
    errs = [(c["key"], e) for c in res["configs"] for e in c["errors"]]
    if notes or errs:
        a("### Notes from this run\n")
        for k, n in notes + errs:
            a(f"- `{k}`: {n}")
        a("")
    a("### Configurations\n")
    a(
        f"- **static**: one `sbatch --partition={PARTITION} --exclusive --nodes={cl['nodes']}` "
        f"job whose script starts `kestrel worker start --slots {cl['cpus']}` on every node "
        "with `srun`, connected before the first stage and canceled when the last ends.\n"
        f"- **Kestrel P, idle T**: `kestrel alloc add slurm --time-limit {TIME_LIMIT} --nodes "
        f"{cl['nodes']} --max-workers {cl['nodes']} --acquire P --idle-timeout T --worker-args "
        f'"--slots {cl["cpus"]}" -- --partition={PARTITION}` on a fresh `kestrel server '
        "start`; `never` is canceled by `alloc remove --force` at the end.\n"
        f"- **HyperQueue, idle T**: `hq alloc add slurm --time-limit {TIME_LIMIT} --idle-timeout "
        f"T --max-worker-count {cl['nodes']} --cpus {cl['cpus']} -- --partition={PARTITION} "
        "--exclusive` (one node per allocation and a backlog of 1, HQ's defaults; `--cpus` "
        "because its workers would otherwise count this machine's cores; `--exclusive` so that "
        "its allocations hold whole nodes like Kestrel's, whose pilot asks for them) on a fresh "
        f"`hq server start` ({res.get('hq_version') or 'hq'}); each stage `hq submit --array "
        "--wait`; `never` is a 24 h idle timeout, removed with `hq alloc remove --force`.\n"
    )
    PART_DOC.write_text("\n".join(L).rstrip() + "\n")
    log(f"wrote {PART_DOC.relative_to(REPO)}")
    splice_section(DOC, PART_DOC, TITLE, "bench/provisioning.py")
    if _plot(res, PNG):
        log(f"wrote {PNG.relative_to(REPO)}")


def call_lines(res: dict, a) -> None:
    """What the call counts are made of, from the samples."""
    for system, name in (("kestrel", "Kestrel"), ("hq", "HyperQueue")):
        ok = [
            s
            for c in res["configs"]
            if c["system"] == system and c["key"] != "static"
            for s in c["samples"]
            if "error" not in s
        ]
        if not ok:
            continue
        kinds = collections.Counter()
        for s in ok:
            # The lines keep every call but squeue's (a few samples of those): its count.
            kinds["squeue"] += s["calls"]["squeue"]
            for ln in s["call_lines"]:
                cmd, _, rest = ln.partition("\t")
                if cmd != "squeue":
                    words = rest.split()
                    kinds[" ".join([cmd, *words[:2]]) if cmd == "scontrol" else cmd] += 1
        a(
            f"- {name}, over its {len(ok)} runs: "
            + ", ".join(f"`{k}` × {v}" for k, v in sorted(kinds.items()))
            + "."
        )
    a("")


def stage_lines(res: dict, a) -> None:
    """Where the makespans differ from static's: the stages that took longer, and when each
    allocation ran (seconds after the first submission)."""
    static = next((c for c in res["configs"] if c["key"] == "static"), None)
    if not static or "error" in static["samples"][0]:
        return
    base = static["samples"][0]["stage_s"]
    runs = [(c, c["samples"][0]) for c in res["configs"] if c["key"] != "static"]
    runs = [(c, s) for c, s in runs if "error" not in s]
    slow = [
        i for i in range(len(base)) if any(abs(s["stage_s"][i] - base[i]) >= 0.5 for _, s in runs)
    ]
    a("### Where the time goes (first run of each)\n")
    a(
        "Seconds each stage took beyond the static allocation's (stages where some "
        "configuration differs by 0.5 s or more), and when each allocation held its nodes "
        "(Slurm's start–end, seconds after the first submission, × its CPUs):\n"
    )
    a("| config | " + " | ".join(f"stage {i + 1}" for i in slow) + " | allocations |")
    a("|---" + "|---:" * len(slow) + "|---|")
    for c, s in runs:
        al = ", ".join(
            f"{j['start'] - s['start_epoch']:.0f}–{j['start'] + j['held_s'] - s['start_epoch']:.0f}"
            f" ×{j['cpus']}"
            for j in s["jobs"]
            if j["ran"]
        )
        a(
            f"| {label(c)} | "
            + " | ".join(f"{s['stage_s'][i] - base[i]:+.1f}" for i in slow)
            + f" | {al} |"
        )
    a("")
    a(
        f"With the static allocation the last stage ended at "
        f"{static['samples'][0]['makespan_s']:.0f} s. A stage wider than the nodes up waits "
        "for the nodes it asks for (Slurm starts a job here in about a second, and a worker "
        "connects a second or two later): the ramp of stages 1-7 and the surge at stage 9 "
        "after the narrow stage 8. Kestrel counts as waiting both the ready tasks and those "
        "a worker holds beyond its free slots (its prefetch), which a new worker takes by "
        "stealing. The narrow stages pack onto the newest allocations, and the idle timeout "
        "gives the others back. The server logs of a run are kept under "
        "`bench/results/provisioning-logs/` (not committed).\n"
    )


def goal_lines(res: dict, a) -> None:
    st = [g for g in res["goals"] if g["goal"] == "static"]
    met = [g["config"] for g in st if g["met"]]
    a(
        "1. **Within 15% of the static makespan while wasting ≤ 30% of its idle CPU-s**: "
        + (f"met by {', '.join(f'`{k}`' for k in met)}" if met else "**met by no configuration**")
        + f" ({len(met)} of {len(st)})."
    )
    for g in st:
        m = next(c for c in res["configs"] if c["key"] == g["config"])["median"]
        a(
            f"   - `{g['config']}`: makespan {m['vs_static_makespan']:.1%} of static "
            f"({'ok' if g['makespan_ok'] else 'over 115%'}), idle {m['vs_static_idle']:.1%} "
            f"of static's ({'ok' if g['idle_ok'] else 'over 30%'})"
        )
    hq = [g for g in res["goals"] if g["goal"] == "hq"]
    if not hq:
        a("2. **Waste less and call the batch system less than HyperQueue**: not measured.\n")
        return
    met = [g for g in hq if g["met"]]
    a(
        "2. **Waste less and call the batch system less than HyperQueue at the same idle "
        f"timeout**: met by {len(met)} of {len(hq)} Kestrel configurations."
    )
    for g in hq:
        m = next(c for c in res["configs"] if c["key"] == g["config"])["median"]
        h = next(c for c in res["configs"] if c["key"] == g["against"])["median"]
        a(
            f"   - `{g['config']}` against `{g['against']}`: idle {_f(m['idle_cpu_s'])} vs "
            f"{_f(h['idle_cpu_s'])} CPU-s ({'less' if g['idle_ok'] else 'NOT less'}); batch "
            f"calls {_f(m['batch_calls'])} vs {_f(h['batch_calls'])} "
            f"({'fewer' if g['calls_ok'] else 'NOT fewer'})"
        )
    a(
        "\n   HyperQueue's allocations are one node each (its default). Of Kestrel's, `one` "
        "asks for one node at a time, as a queue does by default (`--nodes 1`) whatever its "
        "policy; the others ask for up to 4 nodes in one allocation, and an allocation is "
        "given back whole, so its spare nodes idle while a narrow stage runs on one of them.\n"
    )


def _plot(res: dict, png: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return plot_elsewhere(Path(__file__), res, png)
    cs = [c for c in res["configs"] if c["median"]["makespan_s"] is not None]
    if not cs:
        return False
    names = [
        label(c).replace(", idle ", "\nidle ").replace(" (4 nodes, whole run)", "") for c in cs
    ]
    colors = [
        "tab:gray"
        if c["key"] == "static"
        else ("tab:orange" if c["system"] == "hq" else "tab:blue")
        for c in cs
    ]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5.4))
    static = next((c["median"] for c in cs if c["key"] == "static"), None)
    xs = range(len(cs))
    for ax, key, title, bound, blabel in (
        (ax1, "makespan_s", "Time to complete the 18 stages (Table 7)", 1.15, "static + 15%"),
        (ax2, "idle_cpu_s", "Allocated but idle CPU-seconds (Table 7's waste)", 0.30,
         "30% of static"),
    ):  # fmt: skip
        ys = [c["median"][key] for c in cs]
        bars = ax.bar(xs, ys, color=colors)
        for b, c in zip(bars, cs):
            n = c["median"]["allocations"]
            ax.annotate(
                f"{b.get_height():,.0f}" + (f"\n{n:.0f} alloc" if n is not None else ""),
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        if static and static[key]:
            ax.axhline(static[key] * bound, color="red", ls="--", lw=1, label=blabel)
        ax.set_xticks(list(xs), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("seconds" if key == "makespan_s" else "CPU-seconds")
        ax.set_ylim(0, max(y for y in ys if y is not None) * 1.2)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    w, cl = res["workload"], res["cluster"]
    fig.suptitle(
        f"Falkon's 18-stage workload ({w['tasks']} sleep tasks, {w['cpu_s']:,.0f} CPU-s) on Slurm, "
        f"{cl['nodes']} nodes × {cl['cpus']} CPUs — grey: static, blue: Kestrel, orange: "
        f"HyperQueue — {res['date']}",
        fontsize=10,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


# ----- main ------------------------------------------------------------------------------------


def cluster_shape() -> dict:
    r = run_cmd(["/usr/bin/sinfo", "-h", "-p", PARTITION, "-o", "%D %c"], timeout=30)
    if r["rc"] != 0 or not r["out"].split():
        raise SystemExit(f"sinfo failed: {r['err'] or r['out']}")
    nodes, cpus = (int(x.rstrip("+")) for x in r["out"].split()[:2])
    return {"nodes": nodes, "cpus": cpus, "slots": nodes * cpus}


def version(argv: list[str]) -> str | None:
    r = run_cmd(argv, timeout=30)
    return r["out"].strip() if r["rc"] == 0 else None


def save_partial(res: dict, out: Path) -> None:
    """The results so far, after each configuration: a long run that is cut off keeps what
    it measured (`--report` writes the doc from them)."""
    part = json.loads(json.dumps(res))
    part["partial"] = True
    part["elapsed_s"] = time.monotonic() - T0
    part["squeue_at_end"] = None
    part["configs"] = [c for c in part["configs"] if c["samples"]]
    summarize(part)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(part, indent=1))


def merge(base: dict, more: dict) -> dict:
    """`base` with the configurations of `more` added (replacing those of the same key): a grid
    measured in two invocations, such as one cut off midway and the rest run with --only.
    Refuses results of another workload, scale or cluster. The doc names every invocation."""
    for k in ("workload", "cluster", "scale"):
        if base.get(k) != more.get(k):
            raise SystemExit(f"cannot merge: the two results differ in their {k}")
    keys = [c["key"] for c in more["configs"] if c["samples"]]
    if not keys:
        raise SystemExit("cannot merge: the other results have no measured configuration")
    out = dict(base)
    first = {
        "command": base["command"],
        "date": base["date"],
        "elapsed_s": base["elapsed_s"],
        "cut_off": bool(base.get("partial")),
        "configs": [c["key"] for c in base["configs"] if c["key"] not in keys],
        "kestrel": base.get("kestrel"),
    }
    part = {
        "command": more["command"],
        "date": more["date"],
        "elapsed_s": more["elapsed_s"],
        "cut_off": bool(more.get("partial")),
        "configs": keys,
        "kestrel": more.get("kestrel"),
    }
    earlier = [
        dict(p, configs=[k for k in p["configs"] if k not in keys])
        for p in base.get("parts") or [first]
    ]
    out["parts"] = [p for p in earlier if p["configs"]] + [part]
    out["configs"] = [c for c in base["configs"] if c["key"] not in keys] + [
        c for c in more["configs"] if c["key"] in keys
    ]
    order = {c["key"]: i for i, c in enumerate(configs("full", True))}
    out["configs"].sort(key=lambda c: order.get(c["key"], len(order)))
    out["elapsed_s"] = sum(p["elapsed_s"] for p in out["parts"])
    out["partial"] = False
    out["hq_version"] = base.get("hq_version") or more.get("hq_version")
    summarize(out)
    return out


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--plot-only":
        return 0 if _plot(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])) else 1
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--scale", type=float, default=1.0, help="task durations x S (default 1)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--grid", choices=["partial", "full"], default="partial")
    ap.add_argument("--only", help="configuration keys, comma-separated (e.g. static,hq/15s)")
    ap.add_argument("--no-hq", action="store_true")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--no-lock", action="store_true", help="the caller holds the Slurm lock")
    ap.add_argument("--output", choices=["table", "json"], default="table")
    ap.add_argument("--out", type=Path, default=RESULTS / "provisioning.json")
    ap.add_argument("--no-doc", action="store_true", help="write no doc or plot (trial runs)")
    ap.add_argument("--report", type=Path, help="only rewrite the doc from this results file")
    ap.add_argument(
        "--merge",
        type=Path,
        metavar="MORE",
        help="add MORE's configurations (a later run with --only) to --out, and write the doc",
    )
    args = ap.parse_args()
    if args.merge:
        try:
            base, more = (json.loads(f.read_text()) for f in (args.out, args.merge))
        except (OSError, ValueError) as e:
            raise SystemExit(f"cannot merge: {e}") from e
        return publish(merge(base, more), args)
    if args.report:
        res = json.loads(args.report.read_text())
        write_doc(res)
        print(json.dumps(res, indent=1) if args.output == "json" else text_table(res))
        return 0
    plan = configs(args.grid, not args.no_hq and HQ.exists())
    if args.only:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        every = {c["key"]: c for c in configs("full", True)}
        bad = [k for k in keys if k not in every]
        if bad:
            ap.error(f"unknown configuration(s) {bad}; choose from {list(every)}")
        plan = [every[k] for k in keys]
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    atexit.register(PROCS.stop_all)
    if not args.no_build:
        log("cargo build --release -p kestrel-cli")
        subprocess.run(["cargo", "build", "--release", "-p", "kestrel-cli"], cwd=REPO, check=True)
    r = run_cmd([str(TEST_CLUSTER), "start"], timeout=300)
    if r["rc"] != 0:
        raise SystemExit(cmd_error("test-cluster start", r))
    cl = cluster_shape()
    falkon = falkon_facts()
    stages = workload(args.scale, cl["slots"])
    w = {
        "stages": stages,
        "tasks": sum(s["tasks"] for s in stages),
        "cpu_s": sum(s["tasks"] * s["s"] for s in stages),
        "ideal_s": ideal(stages, cl["slots"]),
        "floor_idle_cpu_s": floor_idle(stages, cl["nodes"], cl["cpus"]),
    }
    root = Path(tempfile.mkdtemp(prefix="kestrel-prov-"))
    res: dict = {
        "command": "python3 bench/provisioning.py " + " ".join(sys.argv[1:]),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "scale": args.scale,
        "runs": args.runs,
        "grid": args.grid,
        "cluster": cl,
        "falkon": falkon,
        "workload": w,
        "machine": machine(),
        "slurm": version(["/usr/bin/sinfo", "--version"]),
        "hq_version": version([str(HQ), "--version"]) if HQ.exists() else None,
        "configs": [dict(c, samples=[]) for c in plan],
    }
    log(
        f"{w['tasks']} tasks in 18 stages, {w['cpu_s']:.1f} CPU-s, ideal {w['ideal_s']:.1f} s on "
        f"{cl['slots']} slots; {len(plan)} configuration(s) x {args.runs} run(s)"
    )
    lock = open(LOCK, "a")  # noqa: SIM115 - held to the end of the runs
    try:
        kbin, res["kestrel"] = kestrel_copy(root)
        if not args.no_lock:
            log(f"waiting for {LOCK}")
            fcntl.flock(lock, fcntl.LOCK_EX)
            log("holding the Slurm lock")
        for r_i in range(args.runs):
            for c in res["configs"]:
                log(f"run {r_i + 1}/{args.runs}: {c['key']}")
                try:
                    s = measure(kbin, root, c, stages, cl["nodes"], cl["cpus"])
                except Exception as e:  # noqa: BLE001 - the others still run
                    log(f"  FAILED: {e}")
                    s = {"error": str(e)[:2000]}
                c["samples"].append(s)
                save_partial(res, args.out)
                if "error" not in s:
                    log(
                        f"  makespan {s['makespan_s']:.1f} s, held {s['alloc_cpu_s']:.0f} CPU-s, "
                        f"tasks {s['task_cpu_s']:.0f}, idle {s['idle_cpu_s']:.0f} "
                        f"(after the end {s['tail_cpu_s']:.0f}), {s['allocations']} "
                        f"allocation(s), calls {s['calls']}"
                        + (f"; NOTE {s['notes']}" if s["notes"] else "")
                    )
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
        PROCS.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    left = run_cmd(["/usr/bin/squeue", "-h"], timeout=20)["out"].strip()
    if left:
        log(f"squeue is not empty at the end:\n{left}")
    res["squeue_at_end"] = left
    res["elapsed_s"] = time.monotonic() - T0
    summarize(res)
    return publish(res, args)


def publish(res: dict, args: argparse.Namespace) -> int:
    """Writes the results file and the doc, and prints the table (or the JSON)."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    log(f"results in {args.out}: {', '.join(c['key'] for c in res['configs'])}")
    if not args.no_doc:
        write_doc(res)
    print(json.dumps(res, indent=1) if args.output == "json" else text_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
