#!/usr/bin/env python3
"""AME's W1 and W2 on this machine (issue 13, benchmark 2): the cost of passing a small file
from a task to a task on another worker, against the same number of independent tasks.

    python3 bench/graphs_w.py [--runs 7] [--slots 1,2] [--per-slot 16] [--lengths 0,10,100]
                              [--probe-pairs 10] [--no-journal] [--no-build]
                              [--compare LABEL=BINARY --note TEXT]
                              [--out bench/results/graphs_w.json]
    python3 bench/graphs_w.py --report bench/results/graphs_w.json   # only rewrite the doc

Every round starts, for each slot count, a fresh server on 127.0.0.1 (a directory store in a
temporary directory, the journal on unless `--no-journal`) and two workers of that many slots
with their own cache directories. Worker A offers the named resource `wa`, worker B `wb`
(`worker start --resource wa=SLOTS`); a job that holds `wa=1` runs only on A. With
N = `--per-slot` x 2 x SLOTS tasks and each length L (ms), three workloads run one after the
other on that cluster, in an order rotated from round to round so that drift cancels:

  W1   AME's W1: one job of N independent tasks, `sh -c 'sleep L'` (`sh -c :` for L = 0),
       placed by the scheduler.
  W1p  the same N tasks pinned as W2's are: N/2 on each worker (two jobs, `wa=1` / `wb=1`).
  W2   AME's W2: N/2 producer -> consumer pairs. A producer writes a 10-byte file
       (`printf '012345678\\n' > pI; sleep L`), declared as its output; its consumer declares
       it as input and reads it from its cache (`read x < {input:pI}; sleep L`). Half the
       pairs are produced on A and consumed on B, half the other way (four jobs, submitted as
       one job file; the outputs are therefore `local`: kept in the producer's cache, never
       written to the store), so every file crosses between the workers' caches by a peer
       transfer and both workers have N/2 tasks, as in W1p.

Each measure is the makespan on the server's clocks: from the submission of the first job to
the end of the last task (`submitted_us` and `finished_us` of `job info`); the wall time of
`kestrel submit --file ... --wait` is kept beside it. The overhead per pair is, for each
round, (W2 - W1) / (N/2), the median over the rounds reported (and the same against W1p).

Where the time goes, from `task list`'s times: each worker's slots are replayed (a task takes
the slot that freed first), so that slots x makespan splits exactly into the tasks' run time
(process start to exit), start delays (a free slot and the task on the worker, to its
process start: the previous task's output collection, the staging of inputs not fetched
ahead, the spawn), slots without a task (waiting for the server: the first assignment,
consumers not yet ready or assigned) and the idle tail (a slot done while others still run).
W2 minus W1p of each part, per pair, says what the overhead is made of. For W2, each pair's
hand-off too: producer's end -> consumer's assignment -> consumer's start.

The probe, in each round after the workloads: `--probe-pairs` pairs of length 0 submitted one
pair at a time on the idle cluster, alternately with the consumer on the other worker (its
input fetched from the peer) and on the producer's own (a local cache hit), so the hand-off is
seen without slot waits, and the peer transfer apart from the rest.

`--compare LABEL=BINARY` measures another build too, in the same rounds (its clusters take
turns with the main build's); `--note TEXT` adds a paragraph to the doc (say what the other
build is). Each round first waits (`--quiet-wait`, a minute by default) for the machine to be
quiet: under 25% of its CPU busy over a second. A job file the server refuses because a
writer's job ended before its reader's job came (a race in Kestrel, see the doc) is submitted
again under new names, and counted. Writes the raw results as JSON (after every round, so that
a run cut short keeps what it measured) and docs/benchmarks-graphs-w.md. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import heapq
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from operator import itemgetter
from pathlib import Path

from kbench.machine import build, kestrel_copy, machine
from kbench.procs import stop_groups

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks-graphs-w.md"
WORKERS = ("wa", "wb")  # worker A offers resource `wa`, worker B `wb`
VARIANTS = ("W1", "W1p", "W2")
PARTS = ("run", "start_delay", "no_task", "tail")
MAIN = "main"  # the label of the build under test


def log(msg: str) -> None:
    print(f"[graphs-w] {msg}", file=sys.stderr, flush=True)


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def cpu_busy(seconds: float = 1.0) -> float:
    """The share of this machine's CPU time that was busy over `seconds`."""

    def sample() -> tuple[int, int]:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = f[3] + f[4]
        return idle, sum(f)

    i0, t0 = sample()
    time.sleep(seconds)
    i1, t1 = sample()
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


def wait_quiet(limit: float, busy: float = 0.25) -> float:
    """Waits until under `busy` of the CPU is busy (others' builds, tests), `limit` s at most."""
    deadline = time.time() + limit
    while True:
        b = cpu_busy()
        if b < busy or time.time() > deadline:
            return b
        log(f"the machine is busy ({b * 100:.0f}% CPU); waiting")
        time.sleep(4)


class Refused(RuntimeError):
    """The server refused a job of the file for an input no task writes: the writer's job
    ended and its workflow's files were deleted before the reader's job came (fixed in
    5d68b02 by keeping them 2 s; counted in case it comes back). Nothing of the file was
    kept; the caller submits it again under new names, and counts it."""


class Cluster:
    """A server and two workers of `slots` slots in a fresh directory; `stop` ends them."""

    def __init__(self, kestrel: str, slots: int, journal: bool):
        self.k = kestrel
        self.slots = slots
        self.root = Path(tempfile.mkdtemp(prefix="kgraphs-w-"))
        self.srv = self.root / "server"
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []
        self.runs = 0
        self.refused = 0  # job files refused (and submitted again), warm-up included
        (self.root / "store").mkdir()
        (self.root / "logs").mkdir()
        try:
            self._start(journal)
        except BaseException:
            self.stop()
            raise

    def _start(self, journal: bool) -> None:
        argv = [self.k, "--server-dir", str(self.srv), "server", "start", "--host", "127.0.0.1"]
        argv += ["--store", str(self.root / "store")]
        if not journal:
            argv.append("--no-journal")
        self.spawn(argv, "server")
        deadline = time.time() + 20
        while not (self.srv / "access.json").exists():
            if time.time() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        for name in WORKERS:
            self.spawn(
                [
                    self.k,
                    "--server-dir",
                    str(self.srv),
                    "worker",
                    "start",
                    "--slots",
                    str(self.slots),
                    "--resource",
                    f"{name}={self.slots}",
                    "--cache-dir",
                    str(self.root / f"cache-{name}"),
                ],
                f"worker-{name}",
            )
        deadline = time.time() + 20
        while True:
            workers = json.loads(self.cli(["worker", "list", "--output", "json"]))["workers"]
            if len(workers) == len(WORKERS):
                break
            if time.time() > deadline:
                raise RuntimeError("the workers did not register")
            time.sleep(0.05)
        # Worker id of each resource name, to check where tasks ran.
        self.worker_of = {next(iter(w["resources"])): w["id"] for w in workers}

    def spawn(self, argv: list[str], name: str) -> None:
        out = (self.root / "logs" / f"{name}.log").open("w")
        self.logs.append(out)
        self.procs.append(
            subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def cli(self, args: list[str], cwd: Path | None = None) -> str:
        argv = [self.k, "--server-dir", str(self.srv), *args]
        p = subprocess.run(argv, capture_output=True, text=True, cwd=cwd or self.root, check=False)
        if p.returncode == 2 and "which no task writes" in p.stderr:
            raise Refused(p.stderr.strip())
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:3])} exited {p.returncode}: {p.stderr.strip()}")
        return p.stdout

    def submit_anew(self, make) -> tuple[dict, int]:
        """Submits the jobs `make(tag)` gives, again under a new tag each time the file is
        refused (at most 20 times): the result, and how many times it was refused."""
        for refused in range(20):
            try:
                return self.submit(make(self.tag())), refused
            except Refused as e:
                self.refused += 1
                log(f"refused, submitting again under new names: {e}")
        raise RuntimeError("refused 20 times in a row")

    def tag(self) -> str:
        """A prefix for the file names of the next submission, its own."""
        return f"r{self.runs + 1}-"

    def submit(self, jobs: list[dict]) -> dict:
        """Submits `jobs` as one job file in a fresh directory and waits for them: the jobs'
        `job info`, their tasks, the client's wall time and the makespan on the server."""
        self.runs += 1
        cwd = self.root / f"run-{self.runs}"
        cwd.mkdir()
        (cwd / "jobs.toml").write_text(job_file(jobs))
        t0 = time.perf_counter()
        out = self.cli(["submit", "--file", "jobs.toml", "--wait", "--output", "json"], cwd)
        wall = time.perf_counter() - t0
        ids = json.loads(out)["jobs"]
        infos, tasks = [], []
        for j in ids:
            infos.append(json.loads(self.cli(["job", "info", str(j), "--output", "json"])))
            listed = self.cli(["task", "list", str(j), "--limit", "1000000", "--output", "json"])
            tasks.extend(json.loads(listed)["tasks"])
        shutil.rmtree(cwd, ignore_errors=True)
        return {"wall_s": wall, "infos": infos, "tasks": tasks}

    def stop(self) -> None:
        stop_groups(self.procs)
        for f in self.logs:
            f.close()
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The workloads


def toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string of ASCII is a TOML basic string


def job_file(jobs: list[dict]) -> str:
    text = '[defaults]\nstdout = "none"\nstderr = "none"\n'
    for j in jobs:
        text += f"[[job]]\nname = {toml_str(j['name'])}\narray = {toml_str(j['array'])}\n"
        if j.get("on"):
            text += f"resources = {{ {j['on']} = 1 }}\n"
        for key in ("inputs", "outputs"):
            if j.get(key):
                text += f"{key} = [{', '.join(toml_str(x) for x in j[key])}]\n"
        text += f'command = ["sh", "-c", {toml_str(j["script"])}]\n'
    return text


def sleep_part(ms: int) -> str:
    return f"sleep {ms / 1000:g}" if ms else ":"


def w1(n: int, ms: int, tag: str = "") -> list[dict]:
    return [{"name": "w1", "array": f"1-{n}", "script": sleep_part(ms)}]


def w1p(n: int, ms: int, tag: str = "") -> list[dict]:
    half = n // 2
    return [
        {"name": "w1-a", "array": f"1-{half}", "on": "wa", "script": sleep_part(ms)},
        {"name": "w1-b", "array": f"{half + 1}-{n}", "on": "wb", "script": sleep_part(ms)},
    ]


def pairs(first: int, last: int, made_on: str, read_on: str, ms: int, tag: str) -> list[dict]:
    """Producers of ids first..last on `made_on`, writing `{tag}p{task}` (10 bytes), their
    consumers on `read_on`. Each submission has its own `tag`: a name written again by a
    later workflow is another matter (see the doc's notes)."""
    rng = f"{first}-{last}"
    tail = f"; {sleep_part(ms)}" if ms else ""
    name = f"{tag}p{{task}}"
    return [
        {
            "name": f"prod-{made_on}",
            "array": rng,
            "on": made_on,
            "outputs": [name],
            "script": f"printf '012345678\\n' > {name}{tail}",
        },
        {
            "name": f"cons-{read_on}",
            "array": rng,
            "on": read_on,
            "inputs": [name],
            "script": f"read x < {{input:{name}}}{tail}",
        },
    ]


def w2(n: int, ms: int, tag: str) -> list[dict]:
    """N/2 pairs: the first half produced on A and consumed on B, the second the other way.
    Producers first in the file (a reader must come after its writer)."""
    q = n // 4
    ab = pairs(1, q, "wa", "wb", ms, tag)
    ba = pairs(q + 1, 2 * q, "wb", "wa", ms, tag)
    return [ab[0], ba[0], ab[1], ba[1]]


# ---------------------------------------------------------------------------------------------
# Analysis of one run


def slot_parts(res: dict, slots: int) -> tuple[dict, dict]:
    """Replays each worker's `slots` slots (a task takes the slot that freed first) over
    [first submission, last end]: the slot time split into PARTS (µs, summed over all
    slots), and each task's start delay (µs) by (job, id)."""
    t0 = min(i["submitted_us"] for i in res["infos"])
    t_end = max(t["finished_us"] for t in res["tasks"])
    parts = dict.fromkeys(PARTS, 0)
    delays = {}
    by_worker: dict = {}
    for t in res["tasks"]:
        by_worker.setdefault(t["worker"], []).append(t)
    for tasks in by_worker.values():
        free = [t0] * slots
        for t in sorted(tasks, key=lambda t: t["started_us"]):
            f = heapq.heappop(free)
            ready = max(t["assigned_us"], f)
            parts["no_task"] += max(0, t["assigned_us"] - f)
            delays[(t["job"], t["id"])] = t["started_us"] - ready
            parts["start_delay"] += t["started_us"] - ready
            parts["run"] += t["finished_us"] - t["started_us"]
            heapq.heappush(free, t["finished_us"])
        parts["tail"] += sum(t_end - f for f in free)
    # Workers that ran nothing (W1 may leave one idle): all their slot time is without a task.
    idle_workers = len(WORKERS) - len(by_worker)
    parts["no_task"] += idle_workers * slots * (t_end - t0)
    return parts, delays


def analyse(res: dict, slots: int, worker_of: dict) -> dict:
    """What is kept of one measurement."""
    infos = {i["id"]: i for i in res["infos"]}
    t0 = min(i["submitted_us"] for i in res["infos"])
    t_end = max(i["finished_us"] for i in res["infos"])
    parts, delays = slot_parts(res, slots)
    out: dict = {
        "wall_s": res["wall_s"],
        "makespan_s": (t_end - t0) / 1e6,
        "finished": sum(i["counts"]["finished"] for i in res["infos"]),
        "total": sum(i["counts"]["total"] for i in res["infos"]),
        "parts_us": parts,
        "timing": {i["name"]: i["timing"] for i in res["infos"]},
        "misplaced": 0,
        # Runs that failed (and ran again): none is expected.
        "failed_runs": sum(t["failures"] for t in res["tasks"]),
        "local_hits": 0,
        "peer_hits": 0,
        "store_reads": 0,
    }
    for i in res["infos"]:
        for k in ("local_hits", "peer_hits", "store_reads"):
            out[k] += (i.get("transfers") or {}).get(k, 0)
    prod, cons = {}, {}
    for t in res["tasks"]:
        info = infos[t["job"]]
        on = next(iter(info["resources"]), None)
        if on and t["worker"] != worker_of[on]:
            out["misplaced"] += 1
        if info.get("outputs"):
            prod[t["id"]] = t
        elif info.get("inputs"):
            cons[t["id"]] = t
    if not cons:
        out["start_delay_us"] = list(delays.values())
        return out
    # Per pair: producer's end -> consumer's assignment -> consumer's start, and the
    # consumer's start delay (on a free slot).
    out["end_to_assigned_us"] = [c["assigned_us"] - prod[i]["finished_us"] for i, c in cons.items()]
    out["assigned_to_start_us"] = [c["started_us"] - c["assigned_us"] for c in cons.values()]
    out["end_to_start_us"] = [c["started_us"] - prod[i]["finished_us"] for i, c in cons.items()]
    out["cons_delay_us"] = [delays[(c["job"], c["id"])] for c in cons.values()]
    out["prod_delay_us"] = [delays[(p["job"], p["id"])] for p in prod.values()]
    return out


def measure(c: Cluster, variant: str, n: int, ms: int) -> dict:
    make = {"W1": w1, "W1p": w1p, "W2": w2}[variant]
    res, refused = c.submit_anew(lambda tag: make(n, ms, tag))
    out = analyse(res, c.slots, c.worker_of)
    out["refused"] = refused
    if out["finished"] != out["total"]:
        raise RuntimeError(f"{variant} L={ms}: {out['finished']} of {out['total']} finished")
    if out["misplaced"]:
        raise RuntimeError(f"{variant} L={ms}: {out['misplaced']} tasks ran off their worker")
    return out


def probe(c: Cluster, count: int) -> list[dict]:
    """Pairs of length 0 one at a time on the idle cluster, the consumer alternately on the
    other worker and on the producer's own: each pair's hand-off."""
    out = []
    for i in range(count):
        where = "cross" if i % 2 == 0 else "same"
        made_on = WORKERS[(i // 2) % 2]
        read_on = made_on if where == "same" else WORKERS[1 - WORKERS.index(made_on)]
        res, refused = c.submit_anew(partial(pairs, 1, 1, made_on, read_on, 0))
        h = analyse(res, c.slots, c.worker_of)
        out.append(
            {
                "where": where,
                "end_to_assigned_us": h["end_to_assigned_us"][0],
                "assigned_to_start_us": h["assigned_to_start_us"][0],
                "end_to_start_us": h["end_to_start_us"][0],
                "peer_hits": h["peer_hits"],
                "local_hits": h["local_hits"],
                "failed_runs": h["failed_runs"],
                "refused": refused,
            }
        )
    return out


def one_round(build_label: str, kestrel: str, a, r: int, slots: int) -> dict:
    c = Cluster(kestrel, slots, not a.no_journal)
    try:
        n = a.per_slot * len(WORKERS) * slots
        # Warm-up (not kept): the first peer transfers open the connections between workers.
        c.submit_anew(partial(w2, 8, 0))
        cells = [(ms, v) for ms in a.lengths for v in VARIANTS]
        k = r % len(cells)
        rows = []
        for ms, variant in cells[k:] + cells[:k]:
            m = measure(c, variant, n, ms)
            m.update(build=build_label, round=r, slots=slots, tasks=n, length_ms=ms)
            m["variant"] = variant
            rows.append(m)
            extra = ""
            if variant == "W2":
                extra = (
                    f"  hand-off median {median(m['end_to_start_us']) / 1000:.2f} ms, "
                    f"consumer start delay p90 {pct(m['cons_delay_us'], 0.9) / 1000:.2f} ms, "
                    f"peer hits {m['peer_hits']}/{n // 2}"
                )
            if m["failed_runs"]:
                extra += f"  failed runs {m['failed_runs']}"
            if m["refused"]:
                extra += f"  refused {m['refused']} times first"
            log(
                f"{build_label} round {r} slots {slots} L={ms:3} ms {variant:3}  makespan "
                f"{m['makespan_s'] * 1000:8.1f} ms  wall {m['wall_s'] * 1000:8.1f} ms{extra}"
            )
        probes = probe(c, a.probe_pairs)
        for p in probes:
            p.update(build=build_label, round=r, slots=slots)
        return {"rows": rows, "probe": probes, "refused": c.refused}
    finally:
        c.stop()


# ---------------------------------------------------------------------------------------------
# The report


def cell(rows: list[dict], build_label: str, slots: int, ms: int, variant: str) -> list[dict]:
    return [
        x
        for x in rows
        if x.get("build", MAIN) == build_label
        and x["slots"] == slots
        and x["length_ms"] == ms
        and x["variant"] == variant
    ]


def per_round(rows, build_label, slots, ms, base: str, value) -> list[float]:
    """value(W2 run) - value(base run) per pair, ms, for each round that has both."""
    w2s = {x["round"]: x for x in cell(rows, build_label, slots, ms, "W2")}
    bases = {x["round"]: x for x in cell(rows, build_label, slots, ms, base)}
    return [
        (value(x) - value(bases[r])) * 1000 / (x["tasks"] // 2)
        for r, x in w2s.items()
        if r in bases
    ]


def fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def spread(xs: list[float], digits: int = 2) -> str:
    if not xs:
        return "–"
    return f"{fmt(median(xs), digits)} ({fmt(min(xs), digits)} … {fmt(max(xs), digits)})"


def over(rows, build_label, slots, ms, base: str, key: str) -> str:
    """The per-pair difference W2 - base of `key` (seconds) over the rounds, as text."""
    return spread(per_round(rows, build_label, slots, ms, base, itemgetter(key)))


def part_s(part: str | None, x: dict) -> float:
    """Part `part` of a run's slot time (all parts if None), per slot, in seconds."""
    p = x["parts_us"]
    us = p[part] if part else sum(p.values())
    return us / 1e6 / (len(WORKERS) * x["slots"])


def both(xs: list[dict], key: str) -> str:
    """Median / 90th percentile over the runs' lists `key` (µs), in ms."""
    v = [u / 1000 for x in xs for u in x[key]]
    return f"{fmt(median(v), 2)} / {fmt(pct(v, 0.9), 2)}"


def build_sections(res: dict, build_label: str, a) -> None:
    rows = res["rows"]
    probes = [p for p in res["probe"] if p.get("build", MAIN) == build_label]
    for slots in res["slots"]:
        n = res["per_slot"] * len(WORKERS) * slots
        plural = "s" if slots > 1 else ""
        a(f"### 2 workers × {slots} slot{plural}: N = {n} tasks, {n // 2} pairs\n")
        a(
            "| task length | W1 | W1p | W2 | **overhead per pair, W2 − W1** | W2 − W1p "
            "| W2 − W1, client wall | ideal |"
        )
        a("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for ms in res["lengths"]:
            med = {
                v: median([x["makespan_s"] * 1000 for x in cell(rows, build_label, slots, ms, v)])
                for v in VARIANTS
            }

            where = (rows, build_label, slots, ms)
            a(
                f"| {ms} ms | {fmt(med['W1'])} | {fmt(med['W1p'])} | {fmt(med['W2'])} | "
                f"**{over(*where, 'W1', 'makespan_s')}** | {over(*where, 'W1p', 'makespan_s')} "
                f"| {over(*where, 'W1', 'wall_s')} | {res['per_slot'] * ms} |"
            )
        a("")
        a(
            "Where W2's extra time goes: W2 − W1p of each part of the slots' time, divided by "
            "the slots and the pairs (ms per pair; medians over rounds, so they need not add "
            "up exactly to the median total):\n"
        )
        a("| task length | run | start delay | slot without a task | idle tail | total |")
        a("|---:|---:|---:|---:|---:|---:|")
        for ms in res["lengths"]:
            cols = [
                fmt(
                    median(per_round(rows, build_label, slots, ms, "W1p", partial(part_s, part))), 2
                )
                for part in (*PARTS, None)
            ]
            a(f"| {ms} ms | {' | '.join(cols)} |")
        a("")
        a(
            "W2's pairs (all pairs of all rounds; median / 90th percentile, ms): the "
            "producer's end to the consumer's assignment, the assignment to the consumer's "
            "start (including any wait for a slot), the consumer's start delay once a slot "
            "was free (staging its input if not fetched ahead, the spawn), the producer's (after "
            "the previous task's output was kept, its own spawn), and beside them W1p's.\n"
        )
        a(
            "| task length | end → assigned | assigned → start | consumer start delay "
            "| consumer delays > 20 ms | producer start delay | W1p start delay | peer hits |"
        )
        a("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for ms in res["lengths"]:
            xs = cell(rows, build_label, slots, ms, "W2")
            base = cell(rows, build_label, slots, ms, "W1p")

            delays = [u for x in xs for u in x["cons_delay_us"]]
            slow = sum(1 for u in delays if u > 20_000)
            hits = sum(x["peer_hits"] for x in xs)
            want = sum(x["tasks"] // 2 for x in xs)
            a(
                f"| {ms} ms | {both(xs, 'end_to_assigned_us')} | {both(xs, 'assigned_to_start_us')} | "
                f"{both(xs, 'cons_delay_us')} | {slow} of {len(delays)} | "
                f"{both(xs, 'prod_delay_us')} | {both(base, 'start_delay_us')} | "
                f"{hits} of {want} |"
            )
        a("")
        ps = [p for p in probes if p["slots"] == slots]
        if ps:
            a(
                f"Probe: {len(ps)} single pairs of length 0, one at a time on the idle cluster "
                "(median (min … max), ms):\n"
            )
            a("| consumer on | pairs | end → assigned | assigned → start | end → start |")
            a("|---|---:|---:|---:|---:|")
            for where, label in (
                ("cross", "the other worker (peer fetch)"),
                ("same", "the producer's worker (cache hit)"),
            ):
                q = [p for p in ps if p["where"] == where]
                if q:
                    cols = [
                        spread([p[k] / 1000 for p in q])
                        for k in ("end_to_assigned_us", "assigned_to_start_us", "end_to_start_us")
                    ]
                    a(f"| {label} | {len(q)} | {' | '.join(cols)} |")
            a("")


def failures_line(res: dict, build_label: str, a) -> None:
    """How many task runs failed (and ran again) over the whole run: none is expected."""
    rows = [x for x in res["rows"] if x.get("build", MAIN) == build_label]
    probes = [p for p in res["probe"] if p.get("build", MAIN) == build_label]
    counts = {v: sum(x["failed_runs"] for x in rows if x["variant"] == v) for v in VARIANTS}
    counts["probe"] = sum(p["failed_runs"] for p in probes)
    said = ", ".join(f"{k} {v}" for k, v in counts.items())
    a(f"Task runs that failed (and ran again), in all rounds: {said}.")
    refused = {v: sum(x.get("refused", 0) for x in rows if x["variant"] == v) for v in VARIANTS}
    refused["probe"] = sum(p.get("refused", 0) for p in probes)
    said = ", ".join(f"{k} {v}" for k, v in refused.items())
    a(
        "Job files refused because the writer's files were deleted before the reader's job "
        f"came (should be none since 5d68b02), submitted again: {said}.\n"
    )


def write_doc(res: dict, doc: Path) -> None:
    m = res["machine"]
    L: list[str] = []
    a = L.append
    a("# AME's W1 and W2: a file passed between workers (`bench/graphs_w.py`)\n")
    k = res["kestrel"]
    dirty = " (the working tree had uncommitted changes under crates/)" if k["dirty"] else ""
    version = k["version"].removeprefix("kestrel ")
    busiest = max((x["cpu_busy_before"] for x in res.get("rounds", [])), default=0.0)
    a(
        f"Measured {m['date']} on {m['nproc']} cores ({m['cpu']}): Kestrel {version}, the "
        f"release binary built {k['built']}; the repository at commit {k['commit']}{dirty}. "
        "A server on 127.0.0.1 "
        f"(journal {'on' if res['journal'] else 'off'}, a directory store) and 2 workers, "
        f"each with its own cache directory, fresh for each round; {res['per_slot']} tasks "
        f"per slot; medians of {res['runs']} rounds (min … max in brackets). In a round the "
        "workloads run one after the other on one cluster, in an order rotated from round to "
        f"round; each round started with at most {busiest * 100:.0f}% of the machine's CPU "
        "busy (other work may still have run during a round). Reproduce with "
        "`python3 bench/graphs_w.py` (`--help` says more).\n"
    )
    a(
        "- **W1** (AME's W1): N independent tasks, `sh -c 'sleep L'` (`sh -c :` for length 0).\n"
        "- **W1p**: the same N tasks, half pinned to each worker by a named resource "
        "(`worker start --resource wa=S`, `submit --resource wa=1`), as W2's are.\n"
        "- **W2** (AME's W2): N/2 producer → consumer pairs. The producer writes a 10-byte "
        "file (`printf '012345678\\n' > pI; sleep L`) declared as its output; the consumer, "
        "pinned to the *other* worker, declares it as input and reads it (`read x < "
        "{input:pI}; sleep L`). Half the pairs go A → B, half B → A. The outputs are `local` "
        "(AME's collocated store): kept in the producer's cache, never written to the store; "
        "the consumer's worker fetches each file from the producer's (a peer transfer: the "
        "peer-hit counts below).\n"
    )
    a(
        "Times are makespans on the server's clock (ms): the first job's submission to the "
        "last task's end. **Overhead per pair = (W2 − W1) / (N/2)**, computed per round, "
        "median over rounds; AME's figure is the same difference. Issue 13 asks for ≤ 2 ms "
        "per pair. *Ideal* is the tasks' sleep alone (per slot: tasks × L).\n"
    )
    builds = [MAIN] + [b["label"] for b in res.get("compare", [])]
    for label in builds:
        if label == MAIN:
            a("## The build under test\n")
        else:
            b = next(b for b in res["compare"] if b["label"] == label)
            a(f"## Build `{label}` (binary sha256 {b['sha256']}…), in the same rounds\n")
        build_sections(res, label, a)
        failures_line(res, label, a)
    if res.get("notes"):
        a("## Notes\n")
        for text in res["notes"]:
            a(text + "\n")
    doc.write_text("\n".join(L).rstrip() + "\n")
    log(f"wrote {doc.relative_to(REPO)}")


# ---------------------------------------------------------------------------------------------


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def private_copy(src: Path, root: Path, label: str) -> tuple[str, dict]:
    """A copy of another build's binary, so that a rebuild during the run changes nothing."""
    dst = root / f"kestrel-{label}"
    shutil.copy2(src, dst)
    version = subprocess.run([str(dst), "--version"], capture_output=True, text=True, check=False)
    version = version.stdout
    return str(dst), {
        "label": label,
        "version": version.strip(),
        "sha256": hashlib.sha256(dst.read_bytes()).hexdigest()[:16],
    }


def save(results: dict, out: Path, partial: bool) -> None:
    results["partial"] = partial
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=7, help="rounds (medians over them)")
    ap.add_argument("--slots", type=ints, default=[1, 2], help="slots per worker, e.g. 1,2")
    ap.add_argument("--per-slot", type=int, default=16, help="W1 tasks per slot (AME: 16)")
    ap.add_argument("--lengths", type=ints, default=[0, 10, 100], help="task lengths, ms")
    ap.add_argument("--probe-pairs", type=int, default=10, help="single pairs per round")
    ap.add_argument("--no-journal", action="store_true", help="servers keep no journal")
    ap.add_argument("--no-build", action="store_true", help="use target/release/kestrel as is")
    ap.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="LABEL=BINARY",
        help="measure this other kestrel binary too, in the same rounds",
    )
    ap.add_argument("--note", action="append", default=[], help="a paragraph for the doc")
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="seconds a round waits at most for the machine to be quiet (default 60)",
    )
    ap.add_argument("--report", help="only rewrite the doc from this raw results file")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "graphs_w.json"))
    a = ap.parse_args()
    if a.report:
        write_doc(json.loads(Path(a.report).read_text()), DOC)
        return 0
    if a.per_slot % 2:
        ap.error("--per-slot must be even (W2 splits each worker's tasks into pairs)")
    if not a.no_build:
        build(retries=3)
    scratch = Path(tempfile.mkdtemp(prefix="kgraphs-w-bin-"))
    try:
        kestrel, kinfo = kestrel_copy(scratch)
        builds = [(MAIN, kestrel)]
        compare = []
        for spec in a.compare:
            label, _, path = spec.partition("=")
            if not label or not path or label == MAIN:
                ap.error(f"--compare {spec}: LABEL=BINARY, LABEL not {MAIN!r}")
            binary, info = private_copy(Path(path), scratch, label)
            builds.append((label, binary))
            compare.append(info)
        results: dict = {
            "machine": machine(),
            "kestrel": kinfo,
            "compare": compare,
            "notes": a.note,
            "runs": a.runs,
            "slots": a.slots,
            "per_slot": a.per_slot,
            "lengths": a.lengths,
            "journal": not a.no_journal,
            "rows": [],
            "probe": [],
            "rounds": [],
        }
        for r in range(a.runs):
            plan = [(b, s) for b in builds for s in a.slots]
            k = r % len(plan)
            for (label, binary), slots in plan[k:] + plan[:k]:
                busy = wait_quiet(a.quiet_wait)
                results["rounds"].append(
                    {
                        "round": r,
                        "build": label,
                        "slots": slots,
                        "cpu_busy_before": round(busy, 3),
                        "at": dt.datetime.now(dt.UTC).strftime("%H:%M:%S"),
                    }
                )
                got = one_round(label, binary, a, r, slots)
                results["rows"].extend(got["rows"])
                results["probe"].extend(got["probe"])
                results["rounds"][-1]["refused"] = got["refused"]
                # Kept as it goes: a run cut short leaves what it measured.
                save(results, Path(a.out), partial=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    save(results, Path(a.out), partial=False)
    log(f"raw results in {a.out}")
    write_doc(results, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
