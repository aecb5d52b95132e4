#!/usr/bin/env python3
"""Kestrel's benchmark suite (issue 3): Kestrel side by side with xargs, HyperQueue, Dask, Parsl.

One command builds the release binary, runs every scenario, the peers in the same invocation,
and writes the report:

    python3 bench/run.py [--quick] [--runs 3] [--only NAME,...] [--no-peers]

    --quick        small counts, 1 run, no peers: a smoke test of the script (about a minute);
                   writes bench/results/quick.md instead of docs/benchmarks.md
    --runs N       measure each figure N times (default 3) and report median, min and max
    --only A,B     run only these scenarios: true, noop, efficiency, memory, workers, journal,
                   chaos
                   (a partial run writes bench/results/partial.md)
    --no-peers     skip xargs, HyperQueue, Dask and Parsl
    --peer-tasks N tasks for HyperQueue, Dask and Parsl (default 20000; xargs runs Kestrel's count)
    --no-build     use target/release/kestrel as it is
    --report FILE  only rewrite the report from a raw results file of an earlier run

Scenarios (one machine, 2 slots, every server on 127.0.0.1 with a fresh --server-dir per run):
  true        100,000 /bin/true tasks: `kestrel run` (embedded) and a standalone server + one
              worker (`kestrel submit --wait` timed), against xargs -P 2, HyperQueue, Dask and
              Parsl (run by ../shared/anchors/peers.py); also 10K and 20K tasks
  noop        10K / 100K / 1M tasks on `--exec noop` workers (the dispatch path alone), after a
              one-run sweep of --slots to choose the credit window
  efficiency  sleep 0.01 / 0.1 / 1 tasks on 2 slots: ideal time / measured wall time
  memory      server VmRSS / VmHWM: idle, a 10M-task array, 1M distinct command lines
  workers     200 `--exec noop` worker processes, then the 1M-task noop run
  journal     1M noop and 100K /bin/true with the journal on and off (`--no-journal`), and the
              restart time of a SIGKILLed server whose journal holds 1M finished + 1M queued
  chaos       the repository's chaos test (release build), for its completed-tasks timeline

Outputs: bench/results/<timestamp>.json (raw, git-ignored), bench/results/latest.json (summary
of the latest full run), docs/benchmarks.md and docs/benchmarks.png.

Python 3.11 standard library; matplotlib for the plot, installed by this script into a
virtual environment under ~/.cache/kestrel-bench (or $KESTREL_BENCH_VENV) if it is missing.
The peers install themselves into ~/.cache/kestrel-peers the first time (that takes a while).
Progress goes to stderr. Every process the suite starts is stopped at the end, even on errors.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
PEERS_PY = REPO.parent / "shared" / "anchors" / "peers.py"
DOC = REPO / "docs" / "benchmarks.md"
SCENARIOS = ["true", "noop", "efficiency", "memory", "workers", "journal", "chaos"]
SLOTS = 2  # every scenario runs on 2 task slots (the machine's cores)

FULL = {
    "runs": 3,
    "true_tasks": 100_000,
    "true_counts": [10_000, 20_000],
    "peer_tasks": 20_000,
    "noop_workers": 2,
    "noop_counts": [10_000, 100_000, 1_000_000],
    "noop_tune_slots": [16, 64, 256, 1024, 4096],
    "efficiency": [[0.01, 2000], [0.1, 200], [1.0, 20]],
    "mem_array": 10_000_000,
    "mem_each": 1_000_000,
    "scale_workers": 200,
    "scale_tasks": 1_000_000,
    "scale_tune_slots": [16, 64, 256, 1024],
    "journal_noop": 1_000_000,
    "journal_true": 100_000,
    "restart_tasks": 1_000_000,
}
QUICK = {
    "runs": 1,
    "true_tasks": 2_000,
    "true_counts": [500, 1_000],
    "peer_tasks": 1_000,
    "noop_workers": 2,
    "noop_counts": [1_000, 10_000, 100_000],
    "noop_tune_slots": [64, 1024],
    "efficiency": [[0.01, 200], [0.1, 20], [1.0, 2]],
    "mem_array": 1_000_000,
    "mem_each": 10_000,
    "scale_workers": 20,
    "scale_tasks": 100_000,
    "scale_tune_slots": [16, 256],
    "journal_noop": 100_000,
    "journal_true": 2_000,
    "restart_tasks": 100_000,
}

T0 = time.monotonic()


def log(msg: str) -> None:
    el = time.monotonic() - T0
    print(f"[bench {int(el // 60):3d}:{el % 60:04.1f}] {msg}", file=sys.stderr, flush=True)


# ----- matplotlib: the one dependency outside the standard library -----------------------------


def ensure_matplotlib() -> str | None:
    """Makes `import matplotlib` work, re-running this script in a venv if needed.

    Returns None when matplotlib can be imported, else why not (the suite then runs without the
    plot)."""
    try:
        import matplotlib  # noqa: F401

        return None
    except ImportError:
        pass
    if os.environ.get("KESTREL_BENCH_IN_VENV"):
        return "matplotlib is not importable even in the benchmark venv"
    root = Path(os.environ.get("KESTREL_BENCH_VENV", "~/.cache/kestrel-bench")).expanduser()
    py = root / "bin" / "python"
    ok = (
        py.exists()
        and subprocess.run(
            [str(py), "-c", "import matplotlib"], check=False, capture_output=True
        ).returncode
        == 0
    )
    if not ok:
        log(f"matplotlib missing: installing it into {root} (once)")
        try:
            venv.create(root, with_pip=True)
            subprocess.run(
                [str(py), "-m", "pip", "install", "-q", "matplotlib"], check=True, timeout=1200
            )
        except (OSError, subprocess.SubprocessError) as e:
            return f"cannot install matplotlib into {root}: {e}"
    env = dict(os.environ, KESTREL_BENCH_IN_VENV="1")
    os.execve(str(py), [str(py), str(Path(__file__).resolve()), *sys.argv[1:]], env)
    return None  # not reached


# ----- processes -------------------------------------------------------------------------------


class Procs:
    """Every long-running process the suite starts, each in its own process group."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen] = []

    def start(self, argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, **kw)
        self.live.append(p)
        return p

    def stop(self, p: subprocess.Popen, grace: float = 10.0) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        else:
            # The leader is gone; its group may not be.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if p in self.live:
            self.live.remove(p)

    def stop_all(self) -> None:
        for p in list(self.live):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in list(self.live):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self.stop(p, grace=1)


PROCS = Procs()


def run_cmd(
    argv: list[str], timeout: float, cwd: str | Path | None = None, env: dict | None = None
) -> dict:
    """Runs a command to its end in its own process group; times it (wall and CPU)."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = PROCS.start(
        [str(a) for a in argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
    )
    try:
        out, err = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        PROCS.stop(p, grace=2)
        out, err = p.communicate()
        timed_out = True
    secs = time.perf_counter() - t
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p in PROCS.live:
        PROCS.live.remove(p)
    return {
        "rc": p.returncode,
        "out": out,
        "err": err,
        "seconds": secs,
        "timed_out": timed_out,
        "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
    }


def cmd_error(what: str, r: dict) -> str:
    if r["timed_out"]:
        return f"{what}: timed out after {r['seconds']:.0f} s; stderr: {r['err'][-800:]}"
    return f"{what}: exit {r['rc']}; stderr: {r['err'][-800:]}"


def json_docs(text: str) -> list:
    """The JSON documents printed one after another."""
    dec, docs, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        doc, i = dec.raw_decode(text, i)
        docs.append(doc)


def proc_status(pid: int) -> dict:
    """VmRSS / VmHWM (KiB) of a live process."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def proc_cpu(pid: int) -> dict:
    """CPU seconds of a live process: its own and its reaped children's (the tasks it ran)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return {}
    hz = os.sysconf("SC_CLK_TCK")
    return {"self_s": (int(f[11]) + int(f[12])) / hz, "children_s": (int(f[13]) + int(f[14])) / hz}


def others_busy() -> list[str]:
    """Build or test processes of other people running now (noise on a 2-core machine)."""
    names = {"cargo", "rustc", "cc1", "ld", "cc", "rust-lld", "clippy-driver", "rustdoc"}
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                comm = (d / "comm").read_text().strip()
            except OSError:
                continue
            if comm in names or comm.startswith("kestrel_") or comm.endswith("-test"):
                found.append(comm)
    return sorted(found)


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cores_busy(interval: float = 1.0) -> float:
    """How many cores were busy (anyone's processes) over the next `interval` seconds."""

    def snap() -> tuple[int, int]:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
        return sum(v), v[3] + v[4]

    t0, i0 = snap()
    time.sleep(interval)
    t1, i1 = snap()
    return (1 - (i1 - i0) / max(1, t1 - t0)) * (os.cpu_count() or 1)


class Quiet:
    """Before a measurement, waits (within a budget) until nobody else is using the CPU."""

    THRESHOLD = 0.3  # cores busy with other people's work

    def __init__(self, budget_s: float, per_sample_s: float = 180) -> None:
        self.budget, self.per_sample = budget_s, per_sample_s
        self.waited = 0.0

    def wait(self) -> dict:
        t = time.monotonic()
        busy = cores_busy()
        limit = min(self.per_sample, self.budget - self.waited)
        announced = False
        while busy > self.THRESHOLD and time.monotonic() - t < limit:
            if not announced:
                log(
                    f"  machine busy ({busy:.1f} cores used by others: "
                    f"{', '.join(others_busy()) or 'unknown'}); waiting up to {limit:.0f} s"
                )
                announced = True
            time.sleep(4)
            busy = cores_busy()
        waited = time.monotonic() - t
        self.waited += waited
        return {"busy_cores_before": round(busy, 2), "waited_s": round(waited, 1)}


# ----- a standalone server with workers ---------------------------------------------------------


class Cluster:
    """A `kestrel server start` on 127.0.0.1 in a fresh directory, plus workers."""

    def __init__(self, kbin: str, root: Path, name: str, journal: bool = True) -> None:
        self.kbin = kbin
        self.journal = journal
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
        self.sdir = self.dir / "server"
        self.server: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._logs = contextlib.ExitStack()

    def __enter__(self) -> Self:
        self.start_server()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def k(self, *args) -> list[str]:
        return [self.kbin, *[str(a) for a in args], "--server-dir", str(self.sdir)]

    def _log(self, name: str):
        return self._logs.enter_context(open(self.dir / name, "ab"))

    def start_server(self) -> None:
        log_f = self._log("server.log")
        argv = self.k("server", "start", "--host", "127.0.0.1")
        if not self.journal:
            argv.append("--no-journal")
        self.server = PROCS.start(argv, stdout=log_f, stderr=log_f, cwd=self.dir)
        access = self.sdir / "access.json"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"the server exited at start: {self.log_tail('server.log')}")
            try:
                if json.loads(access.read_text()).get("pid") == self.server.pid:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        raise RuntimeError("the server did not write its access file within 30 s")

    def journal_bytes(self) -> int:
        """Size of the journal: the database and its write-ahead log."""
        return sum(p.stat().st_size for p in self.sdir.glob("journal.sqlite*"))

    def log_tail(self, name: str) -> str:
        try:
            return (self.dir / name).read_text(errors="replace")[-800:]
        except OSError:
            return ""

    def start_workers(
        self,
        n: int,
        slots: int,
        prefetch: int | None = None,
        exec_mode: str = "process",
        timeout: float = 120,
    ) -> float:
        """Starts n worker processes; waits until the server lists them all. Returns seconds."""
        t = time.perf_counter()
        log_f = self._log("workers.log")
        args = ["worker", "start", "--slots", slots, "--exec", exec_mode]
        if prefetch is not None:
            args += ["--prefetch", prefetch]
        for _ in range(n):
            self.workers.append(
                PROCS.start(self.k(*args), stdout=subprocess.DEVNULL, stderr=log_f, cwd=self.dir)
            )
        want = len(self.workers)
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            dead = [w for w in self.workers if w.poll() is not None]
            if dead:
                raise RuntimeError(f"{len(dead)} worker(s) exited: {self.log_tail('workers.log')}")
            seen = len(self.worker_list())
            if seen >= want:
                return time.perf_counter() - t
            time.sleep(0.1 if n < 50 else 0.5)
        raise RuntimeError(f"only {seen} of {want} workers connected within {timeout:.0f} s")

    def worker_list(self) -> list:
        r = run_cmd(self.k("worker", "list", "--output", "json"), timeout=60, cwd=self.dir)
        if r["rc"] != 0:
            raise RuntimeError(cmd_error("kestrel worker list", r))
        return json.loads(r["out"])

    def submit(self, args: list, tasks: int, wait: bool = True, timeout: float = 3600) -> dict:
        """Times `kestrel submit ARGS [--wait]` and checks every task finished."""
        argv = self.k("submit", "--output", "json", *args[:-1]) + (["--wait"] if wait else [])
        argv += ["--", *args[-1]]
        r = run_cmd(argv, timeout=timeout, cwd=self.dir)
        if r["rc"] != 0:
            raise RuntimeError(cmd_error("kestrel submit", r))
        docs = json_docs(r["out"])
        if docs[0].get("tasks") != tasks:
            raise RuntimeError(f"submitted {docs[0].get('tasks')} tasks, expected {tasks}")
        if wait:
            fin = docs[-1]["counts"]["finished"]
            if fin != tasks:
                raise RuntimeError(f"only {fin} of {tasks} tasks finished: {docs[-1]}")
        return {
            "seconds": r["seconds"],
            "tasks": tasks,
            "rate": tasks / r["seconds"],
            "submit_cpu_s": r["cpu_s"],
            "jobs": docs[0].get("jobs"),
        }

    def job_info(self, job: int) -> dict:
        r = run_cmd(self.k("job", "info", job, "--output", "json"), timeout=60, cwd=self.dir)
        return json.loads(r["out"]) if r["rc"] == 0 else {"error": cmd_error("job info", r)}

    def job_list(self) -> list:
        r = run_cmd(self.k("job", "list", "--output", "json"), timeout=120, cwd=self.dir)
        if r["rc"] != 0:
            raise RuntimeError(cmd_error("kestrel job list", r))
        return json.loads(r["out"])

    def cpu(self) -> dict:
        """CPU seconds used so far by the server and by the workers (and their tasks)."""
        out = {"server": proc_cpu(self.server.pid) if self.server else {}}
        ws = [proc_cpu(w.pid) for w in self.workers]
        out["workers_self_s"] = sum(w.get("self_s", 0) for w in ws)
        out["workers_children_s"] = sum(w.get("children_s", 0) for w in ws)
        return out

    def close(self) -> None:
        if self.server and self.server.poll() is None:
            run_cmd(self.k("server", "stop"), timeout=15, cwd=self.dir)
        for p in [*self.workers, *([self.server] if self.server else [])]:
            PROCS.stop(p, grace=10)
        self._logs.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# ----- statistics ------------------------------------------------------------------------------


def summary(samples: list[dict], key: str = "rate") -> dict:
    vals = [s[key] for s in samples if key in s]
    if not vals:
        return {}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def measured(samples: list[dict], **extra) -> dict:
    """A figure: its raw samples and the median/min/max of rate and seconds."""
    ok = [s for s in samples if "error" not in s]
    d = {"samples": samples, "rate": summary(ok, "rate"), "seconds": summary(ok, "seconds")}
    d["errors"] = [s["error"] for s in samples if "error" in s]
    d.update(extra)
    return d


def med(fig: dict | None, key: str = "rate") -> float | None:
    if not fig:
        return None
    return (fig.get(key) or {}).get("median")


# ----- the suite -------------------------------------------------------------------------------


class Suite:
    def __init__(self, args, cfg: dict, kbin: str, root: Path) -> None:
        self.args, self.cfg, self.kbin, self.root = args, cfg, kbin, root
        self.runs = cfg["runs"]
        self.res: dict = {}
        self.peers_enabled = not args.no_peers and not args.quick
        self.peer_dead: dict[str, str] = {}
        self.quiet = Quiet(args.idle_wait)

    def attempt(self, what: str, fn, *a, **kw) -> dict:
        """One measurement; a failure becomes {"error": ...} instead of ending the suite."""
        env = self.quiet.wait()
        busy = others_busy()
        env["load1"] = loadavg()
        if busy:
            env["others_busy"] = busy
        try:
            s = fn(*a, **kw)
        except Exception as e:  # noqa: BLE001 - recorded in the results and the report
            log(f"  {what}: FAILED: {e}")
            return {"error": f"{what}: {e}", **env}
        s.update(env)
        return s

    # --- peers.py ---

    def peer(self, name: str, tasks: int) -> list[dict]:
        """One run of peers.py for one peer: its rows (dask and parsl give `true` and `noop`)."""
        if name in self.peer_dead:
            raise RuntimeError(f"skipped: failed before ({self.peer_dead[name]})")
        if not PEERS_PY.exists():
            raise RuntimeError(f"{PEERS_PY} not found")
        out = self.root / f"peer-{name}.json"
        out.unlink(missing_ok=True)
        r = run_cmd(
            [
                sys.executable,
                PEERS_PY,
                "--only",
                name,
                "--tasks",
                tasks,
                "--slots",
                SLOTS,
                "--json",
                out,
            ],
            timeout=self.args.peer_timeout,
            cwd=self.root,
        )
        if r["rc"] != 0 or not out.exists():
            msg = cmd_error(f"peers.py --only {name}", r)
            self.peer_dead[name] = msg[:300]
            raise RuntimeError(msg)
        rows = json.loads(out.read_text())
        rows = [
            {
                "workload": row["workload"],
                "seconds": row["seconds"],
                "tasks": row["tasks"],
                "rate": row["tasks_per_s"],
            }
            for row in rows
        ]
        if name == "xargs":  # for the others this would count their cluster's start-up too
            rows[0]["cpu_s"] = r["cpu_s"]
        return rows

    # --- scenario 1: /bin/true ---

    def k_run(self, tasks: int) -> dict:
        d = Path(tempfile.mkdtemp(prefix="run-", dir=self.root))
        try:
            r = run_cmd(
                [
                    self.kbin,
                    "run",
                    "--slots",
                    SLOTS,
                    "--stdout",
                    "none",
                    "--stderr",
                    "none",
                    "--array",
                    f"1-{tasks}",
                    "--quiet",
                    "--output",
                    "json",
                    "--",
                    "/bin/true",
                ],
                timeout=3600,
                cwd=d,
                env=dict(os.environ, TMPDIR=str(d)),
            )
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if r["rc"] != 0:
            raise RuntimeError(cmd_error("kestrel run", r))
        j = json_docs(r["out"])[-1]
        if j.get("finished") != tasks:
            raise RuntimeError(f"only {j.get('finished')} of {tasks} finished")
        return {
            "seconds": r["seconds"],
            "tasks": tasks,
            "rate": tasks / r["seconds"],
            "internal_wall_s": j.get("wall_s"),
            "cpu_s": r["cpu_s"],
        }

    def k_standalone(
        self,
        tasks: int,
        argv: list[str],
        slots: int = SLOTS,
        name: str = "true",
        journal: bool = True,
    ) -> dict:
        with Cluster(self.kbin, self.root, name, journal) as c:
            c.start_workers(1, slots)
            cpu0 = c.cpu()
            s = c.submit(
                ["--array", f"1-{tasks}", "--stdout", "none", "--stderr", "none", argv], tasks
            )
            cpu1 = c.cpu()
            info = c.job_info(s["jobs"][0])
        s["timing"] = info.get("timing")
        s["span_s"] = _span(info)
        s["cpu"] = {
            "server_s": cpu1["server"].get("self_s", 0) - cpu0["server"].get("self_s", 0),
            "worker_s": cpu1["workers_self_s"] - cpu0["workers_self_s"],
            "tasks_s": cpu1["workers_children_s"] - cpu0["workers_children_s"],
            "submit_s": s.pop("submit_cpu_s"),
        }
        return s

    def scenario_true(self) -> None:
        n = self.cfg["true_tasks"]
        pt = self.args.peer_tasks or self.cfg["peer_tasks"]
        log(f"scenario true: {n} x /bin/true on {SLOTS} slots, {self.runs} run(s)")
        figs: dict[str, list] = {"kestrel_run": [], "kestrel_submit": [], "xargs": []}
        peer_rows: dict[str, list] = {}
        for r in range(self.runs):
            log(f" run {r + 1}/{self.runs}: kestrel run (embedded)")
            s = self.attempt("kestrel run", self.k_run, n)
            figs["kestrel_run"].append(s)
            _show(s)
            log(f" run {r + 1}/{self.runs}: kestrel server + worker, submit --wait")
            s = self.attempt("kestrel submit", self.k_standalone, n, ["/bin/true"])
            figs["kestrel_submit"].append(s)
            _show(s)
            if not self.peers_enabled:
                continue
            log(f" run {r + 1}/{self.runs}: xargs -P {SLOTS} (peers.py --only xargs)")
            s = self.attempt("xargs", lambda: self.peer("xargs", n)[0])
            figs["xargs"].append(s)
            _show(s)
            for p in ["hyperqueue", "dask", "parsl"]:
                log(f" run {r + 1}/{self.runs}: {p} (peers.py --only {p} --tasks {pt})")
                env = self.quiet.wait()
                env["load1"] = loadavg()
                try:
                    rows = self.peer(p, pt)
                except Exception as e:  # noqa: BLE001
                    log(f"  {p}: FAILED: {str(e)[:300]}")
                    peer_rows.setdefault(f"{p}/true", []).append({"error": str(e), **env})
                    continue
                for row in rows:
                    row.update(env)
                    peer_rows.setdefault(f"{p}/{row['workload']}", []).append(row)
                    _show(row, f"{p}/{row['workload']}")
        out = {
            "tasks": n,
            "slots": SLOTS,
            "peer_tasks": pt,
            "peers_enabled": self.peers_enabled,
            "kestrel_run": measured(figs["kestrel_run"]),
            "kestrel_submit": measured(figs["kestrel_submit"]),
            "xargs": measured(figs["xargs"]) if self.peers_enabled else None,
            "peers": {k: measured(v) for k, v in peer_rows.items()},
        }
        # Rate against task count: Kestrel standalone and xargs at smaller counts.
        counts = {}
        for cnt in self.cfg["true_counts"]:
            ks, xs = [], []
            for r in range(self.runs):
                log(f" {cnt} x /bin/true run {r + 1}/{self.runs}: kestrel submit")
                s = self.attempt("kestrel submit", self.k_standalone, cnt, ["/bin/true"])
                ks.append(s)
                _show(s)
                if self.peers_enabled:
                    log(f" {cnt} x /bin/true run {r + 1}/{self.runs}: xargs")
                    s = self.attempt("xargs", lambda c=cnt: self.peer("xargs", c)[0])
                    xs.append(s)
                    _show(s)
            counts[str(cnt)] = {
                "kestrel_submit": measured(ks),
                "xargs": measured(xs) if self.peers_enabled else None,
            }
        out["counts"] = counts
        self.res["true"] = out

    # --- scenario 2: noop ---

    def k_noop(
        self,
        tasks: int,
        workers: int,
        slots: int,
        prefetch: int | None = None,
        name: str = "noop",
        journal: bool = True,
    ) -> dict:
        with Cluster(self.kbin, self.root, name, journal) as c:
            connect_s = c.start_workers(
                workers, slots, prefetch, exec_mode="noop", timeout=max(120, workers)
            )
            rss_workers = sum(proc_status(w.pid).get("VmRSS", 0) for w in c.workers)
            cpu0 = c.cpu()
            s = c.submit(
                ["--array", f"1-{tasks}", "--stdout", "none", "--stderr", "none", ["/bin/true"]],
                tasks,
            )
            cpu1 = c.cpu()
            s["server_rss_kib"] = proc_status(c.server.pid)
            s["journal_bytes"] = c.journal_bytes()
            if workers > 2:
                per = [w.get("finished", 0) for w in c.worker_list()]
                s["per_worker_finished"] = {
                    "min": min(per),
                    "max": max(per),
                    "idle_workers": sum(1 for x in per if x == 0),
                }
        s["connect_s"] = connect_s
        s["workers_rss_kib"] = rss_workers
        s["cpu"] = {
            "server_s": cpu1["server"].get("self_s", 0) - cpu0["server"].get("self_s", 0),
            "workers_s": cpu1["workers_self_s"] - cpu0["workers_self_s"],
            "submit_s": s.pop("submit_cpu_s"),
        }
        return s

    def scenario_noop(self) -> None:
        w = self.cfg["noop_workers"]
        big = self.cfg["noop_counts"][-1]
        log(f"scenario noop: {w} noop workers; sweep of --slots with {big} tasks (1 run each)")
        sweep = []
        for slots in self.cfg["noop_tune_slots"]:
            s = self.attempt(f"noop slots={slots}", self.k_noop, big, w, slots)
            s["slots"], s["prefetch"] = slots, slots
            sweep.append(s)
            _show(s, f"slots={slots} prefetch={slots}")
        good = [s for s in sweep if "error" not in s]
        chosen = max(good, key=lambda s: s["rate"])["slots"] if good else 1024
        log(f" chose --slots {chosen} (--prefetch {chosen}, the default) per worker")
        counts = {}
        for cnt in self.cfg["noop_counts"]:
            samples = []
            for r in range(self.runs):
                log(f" {cnt} noop tasks run {r + 1}/{self.runs}")
                s = self.attempt("noop", self.k_noop, cnt, w, chosen)
                samples.append(s)
                _show(s)
            counts[str(cnt)] = measured(samples)
        self.res["noop"] = {
            "workers": w,
            "slots": chosen,
            "prefetch": chosen,
            "sweep": sweep,
            "sweep_tasks": big,
            "counts": counts,
        }

    # --- scenario 3: efficiency ---

    def scenario_efficiency(self) -> None:
        log(f"scenario efficiency: sleep tasks on {SLOTS} slots")
        rows = []
        for length, n in self.cfg["efficiency"]:
            ideal = n * length / SLOTS
            samples = []
            for r in range(self.runs):
                log(f" {n} x sleep {length:g} (ideal {ideal:.1f} s) run {r + 1}/{self.runs}")
                s = self.attempt(
                    "efficiency", self.k_standalone, n, ["sleep", f"{length:g}"], name="eff"
                )
                if "error" not in s:
                    s["efficiency"] = ideal / s["seconds"]
                    if s.get("span_s"):
                        s["span_efficiency"] = ideal / s["span_s"]
                samples.append(s)
                _show(s, extra=f"efficiency {s.get('efficiency', 0):.1%}")
            fig = measured(samples, length_s=length, tasks=n, ideal_s=ideal)
            fig["efficiency"] = summary([s for s in samples if "error" not in s], "efficiency")
            fig["span_efficiency"] = summary(
                [s for s in samples if "span_efficiency" in s], "span_efficiency"
            )
            runs = [s["timing"]["mean_run_us"] for s in samples if s.get("timing")]
            fig["mean_run_ms"] = statistics.median(runs) / 1000 if runs else None
            rows.append(fig)
        self.res["efficiency"] = {"slots": SLOTS, "rows": rows}

    # --- scenario 4: memory ---

    def mem_one(self, kind: str, n: int, each_file: Path | None) -> dict:
        with Cluster(self.kbin, self.root, f"mem-{kind}") as c:
            time.sleep(1.0)
            idle = proc_status(c.server.pid)
            if kind == "array":
                args = ["--array", f"1-{n}", "--stdout", "none", "--stderr", "none", ["/bin/true"]]
            else:
                args = [
                    "--each",
                    each_file,
                    "--stdout",
                    "none",
                    "--stderr",
                    "none",
                    ["echo", "{line}"],
                ]
            s = c.submit(args, n, wait=False)
            time.sleep(1.0)
            st = proc_status(c.server.pid)
            jobs = c.job_list()
            total = sum(sum(j["counts"].values()) for j in jobs)
            if total != n:
                raise RuntimeError(f"the server holds {total} tasks, expected {n}")
            after_list = proc_status(c.server.pid)
            if c.server.poll() is not None:
                raise RuntimeError(f"the server died: {c.log_tail('server.log')}")
        return {
            "seconds": s["seconds"],
            "tasks": n,
            "rate": n / s["seconds"],
            "idle_rss_kib": idle.get("VmRSS"),
            "rss_kib": st.get("VmRSS"),
            "hwm_kib": st.get("VmHWM"),
            "rss_after_job_list_kib": after_list.get("VmRSS"),
            "hwm_after_job_list_kib": after_list.get("VmHWM"),
        }

    def scenario_memory(self) -> None:
        na, ne = self.cfg["mem_array"], self.cfg["mem_each"]
        log(f"scenario memory: {na}-task array, {ne} distinct command lines, no workers")
        each_file = self.root / "each-lines.txt"
        with open(each_file, "w") as f:
            f.writelines(f"input-{i:06d}.dat\n" for i in range(1, ne + 1))
        out = {}
        for kind, n in [("array", na), ("each", ne)]:
            samples = []
            for r in range(self.runs):
                log(f" {kind} {n} run {r + 1}/{self.runs}")
                s = self.attempt(f"memory {kind}", self.mem_one, kind, n, each_file)
                samples.append(s)
                if "error" not in s:
                    log(
                        f"  idle {s['idle_rss_kib'] / 1024:.1f} MiB, after submit VmRSS "
                        f"{s['rss_kib'] / 1024:.1f} MiB, VmHWM {s['hwm_kib'] / 1024:.1f} MiB "
                        f"(submit {s['seconds']:.2f} s)"
                    )
            fig = measured(samples, tasks=n)
            ok = [s for s in samples if "error" not in s]
            for k in (
                "idle_rss_kib",
                "rss_kib",
                "hwm_kib",
                "rss_after_job_list_kib",
                "hwm_after_job_list_kib",
            ):
                fig[k] = summary(ok, k)
            out[kind] = fig
        each_file.unlink(missing_ok=True)
        self.res["memory"] = out

    # --- scenario 5: many workers ---

    def scenario_workers(self) -> None:
        """200 workers against the 2-worker rate of scenario 2. Each configuration gets its best
        credit window, as scenario 2's sweep gives the 2 workers theirs; the run at the same
        total window as 2 workers shows what the window alone costs."""
        nw, n = self.cfg["scale_workers"], self.cfg["scale_tasks"]
        noop = self.res.get("noop")
        total_slots = (noop["slots"] if noop else 1024) * self.cfg["noop_workers"]
        same_window = max(1, round(total_slots / nw))
        log(f"scenario workers: {nw} noop workers; sweep of --slots with {n} tasks (1 run each)")
        sweep = []
        for slots in self.cfg["scale_tune_slots"]:
            x = self.attempt(f"workers slots={slots}", self.k_noop, n, nw, slots, name="scale")
            x["slots"] = slots
            sweep.append(x)
            _show(x, f"slots={slots}", f"{nw} workers connected in {x.get('connect_s', 0):.1f} s")
        good = [x for x in sweep if "error" not in x]
        slots = max(good, key=lambda x: x["rate"])["slots"] if good else 64
        log(f" chose --slots {slots} per worker")
        samples = []
        for r in range(self.runs):
            log(f" run {r + 1}/{self.runs}: {nw} workers x --slots {slots}")
            x = self.attempt("workers", self.k_noop, n, nw, slots, name="scale")
            samples.append(x)
            _show(x, extra=f"{nw} workers connected in {x.get('connect_s', 0):.1f} s")
        log(f" same total window as 2 workers: --slots {same_window} (1 run each)")
        small = {
            str(w): self.attempt(
                "workers same window", self.k_noop, n, w, total_slots // w, name="scale"
            )
            for w in (self.cfg["noop_workers"], nw)
        }
        for w, x in small.items():
            _show(x, f"{w} workers x --slots {total_slots // int(w)}")
        ref = med((noop or {}).get("counts", {}).get(str(n)))
        self.res["workers"] = measured(
            samples,
            workers=nw,
            slots=slots,
            prefetch=slots,
            tasks=n,
            ref_rate=ref,
            sweep=sweep,
            same_window={"total_slots": total_slots, "runs": small},
        )

    # --- issue 4: the journal's cost, restart time, chaos ---

    def scenario_journal(self) -> None:
        nn, nt = self.cfg["journal_noop"], self.cfg["journal_true"]
        noop = self.res.get("noop")
        slots = noop["slots"] if noop else 1024
        log(f"scenario journal: {nn} noop and {nt} /bin/true tasks, journal on and off")
        out: dict = {"noop_tasks": nn, "true_tasks": nt, "slots": slots}
        for kind in ("noop", "true"):
            for on in (True, False):
                samples = []
                for r in range(self.runs):
                    mode = "on" if on else "off"
                    log(f" {kind} journal {mode} run {r + 1}/{self.runs}")
                    if kind == "noop":
                        s = self.attempt(
                            f"journal {kind} {mode}",
                            self.k_noop,
                            nn,
                            2,
                            slots,
                            name="jnoop",
                            journal=on,
                        )
                    else:
                        s = self.attempt(
                            f"journal {kind} {mode}",
                            self.k_standalone,
                            nt,
                            ["/bin/true"],
                            name="jtrue",
                            journal=on,
                        )
                    samples.append(s)
                    extra = (
                        f"journal {s['journal_bytes'] / max(1, s['tasks']):.1f} B/task"
                        if s.get("journal_bytes")
                        else ""
                    )
                    _show(s, extra=extra)
                fig = measured(samples)
                fig["journal_bytes"] = summary(
                    [x for x in samples if "journal_bytes" in x], "journal_bytes"
                )
                out[f"{kind}_{'on' if on else 'off'}"] = fig
        samples = []
        n = self.cfg["restart_tasks"]
        for r in range(self.runs):
            log(f" restart with {n:,} finished + {n:,} queued tasks, run {r + 1}/{self.runs}")
            s = self.attempt("restart", self.restart_one, n, slots)
            samples.append(s)
            if "error" not in s:
                log(
                    f"  journal {s['journal_bytes'] / 2**20:.1f} MiB; answers after "
                    f"{s['ready_s']:.2f} s, dispatches after {s['dispatch_s']:.2f} s "
                    f"(replay {s.get('replay', '?')})"
                )
        fig = measured(samples, tasks=n)
        for k in ("ready_s", "dispatch_s", "journal_bytes"):
            fig[k] = summary([x for x in samples if k in x], k)
        out["restart"] = fig
        self.res["journal"] = out

    def restart_one(self, n: int, slots: int) -> dict:
        """A journal with n finished and n queued tasks; kill -9; time the restart."""
        with Cluster(self.kbin, self.root, "restart") as c:
            c.start_workers(2, slots, exec_mode="noop")
            c.submit(
                ["--array", f"1-{n}", "--stdout", "none", "--stderr", "none", ["/bin/true"]], n
            )
            for w in c.workers:
                PROCS.stop(w)
            c.workers = []
            c.submit(
                ["--array", f"1-{n}", "--stdout", "none", "--stderr", "none", ["/bin/true"]],
                n,
                wait=False,
            )
            jbytes = c.journal_bytes()
            os.killpg(c.server.pid, signal.SIGKILL)
            c.server.wait()
            t0 = time.perf_counter()
            c.start_server()
            # The access file is written after the replay: the server answers from here on.
            ready = time.perf_counter() - t0
            c.start_workers(1, slots, exec_mode="noop")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                info = c.job_info(2)
                if (info.get("summary") or {}).get("counts", {}).get("finished", 0) > 0:
                    break
                time.sleep(0.01)
            else:
                raise RuntimeError("the restarted server dispatched nothing within 120 s")
            dispatch = time.perf_counter() - t0
            replay = next(
                (
                    ln.split("from the journal in ")[-1].strip()
                    for ln in (c.dir / "server.log").read_text(errors="replace").splitlines()[::-1]
                    if "from the journal in" in ln
                ),
                None,
            )
        return {
            "ready_s": ready,
            "dispatch_s": dispatch,
            "journal_bytes": jbytes,
            "seconds": dispatch,
            "rate": 2 * n / dispatch,
            "replay": replay,
        }

    def scenario_chaos(self) -> None:
        """Runs the repository's chaos test and keeps its completed-tasks timeline."""
        log("scenario chaos: cargo test --release -p kestrel-cli --test chaos")
        csv = self.root / "chaos.csv"
        r = run_cmd(
            [
                "cargo",
                "test",
                "--release",
                "-q",
                "-p",
                "kestrel-cli",
                "--test",
                "chaos",
                "--",
                "--nocapture",
            ],
            timeout=1800,
            cwd=REPO,
            env=dict(os.environ, KESTREL_CHAOS_TIMELINE=str(csv)),
        )
        line = next((ln for ln in r["out"].splitlines() if ln.startswith("chaos:")), None)
        if r["rc"] != 0 or not csv.exists():
            raise RuntimeError(cmd_error("the chaos test", r))
        rows = []
        for ln in csv.read_text().splitlines()[1:]:
            t, fin, ev = ln.split(",", 2)
            rows.append([float(t), int(fin), ev])
        log(f"  {line}")
        self.res["chaos"] = {"summary": line, "timeline": rows}


def _span(info: dict) -> float | None:
    t = (info or {}).get("timing") or {}
    return t["span_us"] / 1e6 if t.get("span_us") else None


def _show(s: dict, label: str = "", extra: str = "") -> None:
    if "error" in s:
        return
    msg = (
        f"  {label + ': ' if label else ''}{s['tasks']} tasks in {s['seconds']:.3f} s = "
        f"{s['rate']:,.0f} tasks/s"
    )
    log(msg + (f"; {extra}" if extra else ""))


# ----- set-up: machine, build ------------------------------------------------------------------


def sh(argv: list[str], cwd: Path = REPO) -> str:
    try:
        return subprocess.run(
            argv, check=False, capture_output=True, text=True, cwd=cwd, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        mem = f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "nproc": sh(["nproc"]) or str(os.cpu_count()),
        "cpu": cpu,
        "kernel": platform.release(),
        "os": sh(["uname", "-sm"]),
        "memory": mem,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def build(retries: int) -> None:
    for i in range(retries):
        log(f"cargo build --release (attempt {i + 1}/{retries})")
        p = subprocess.run(
            ["cargo", "build", "--release"], check=False, cwd=REPO, capture_output=True, text=True
        )
        if p.returncode == 0:
            return
        log(f"build failed:\n{p.stderr[-1500:]}")
        if i + 1 < retries:
            log("waiting 60 s (others may be mid-edit) and retrying")
            time.sleep(60)
    raise SystemExit("cargo build --release failed; see above")


def kestrel_copy(root: Path) -> tuple[str, dict]:
    """Copies the binary, so a rebuild by someone else during the suite changes nothing."""
    src = REPO / "target" / "release" / "kestrel"
    if not src.exists():
        raise SystemExit(f"{src} does not exist; build it with cargo build --release")
    dst = root / "kestrel"
    shutil.copy2(src, dst)
    digest = hashlib.sha256(dst.read_bytes()).hexdigest()
    info = {
        "version": sh([str(dst), "--version"]),
        "sha256": digest[:16],
        "commit": sh(["git", "rev-parse", "--short", "HEAD"]),
        "dirty": bool(
            sh(["git", "status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"])
        ),
        "built": dt.datetime.fromtimestamp(src.stat().st_mtime, dt.UTC).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
    }
    return str(dst), info


# ----- report ----------------------------------------------------------------------------------


def fmt_rate(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def fmt_s(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def mib(kib: float | None) -> str:
    return "—" if kib is None else f"{kib / 1024:,.1f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def rate_cells(fig: dict | None) -> list[str]:
    if not fig or not fig.get("rate"):
        return ["—"] * 4
    r, s = fig["rate"], fig["seconds"]
    return [fmt_s(s["median"]), fmt_rate(r["median"]), _mm(r), str(r["n"])]


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**pass**" if ok else "**FAIL**")


def targets(res: dict) -> list[tuple[str, str, bool | None]]:
    sc = res["scenarios"]
    rows = []
    t = sc.get("true")
    if t:
        x = med(t.get("xargs"))
        hq = med(t["peers"].get("hyperqueue/true"))
        for key, label in [("kestrel_run", "`kestrel run`"), ("kestrel_submit", "server + worker")]:
            k = med(t[key])
            rx, rh = ratio(k, x), ratio(k, hq)
            rows.append(
                (
                    f"/bin/true, {label}: ≥ 90% of xargs -P 2",
                    f"{rx:.0%} ({fmt_rate(k)} vs {fmt_rate(x)} tasks/s)" if rx else "—",
                    None if rx is None else rx >= 0.9,
                )
            )
            rows.append(
                (
                    f"/bin/true, {label}: ≥ 2× HyperQueue",
                    f"{rh:.1f}× ({fmt_rate(k)} vs {fmt_rate(hq)} tasks/s)" if rh else "—",
                    None if rh is None else rh >= 2,
                )
            )
    n = sc.get("noop")
    if n:
        big = max(n["counts"], key=int)
        k = med(n["counts"][big])
        rows.append(
            (
                f"noop, {int(big):,} tasks end to end: ≥ 100,000 tasks/s",
                f"{fmt_rate(k)} tasks/s",
                None if k is None else k >= 100_000,
            )
        )
    e = sc.get("efficiency")
    if e:
        for row in e["rows"]:
            if abs(row["length_s"] - 0.1) < 1e-9:
                v = (row.get("efficiency") or {}).get("median")
                rows.append(
                    (
                        "efficiency of 100 ms tasks: ≥ 95%",
                        "—" if v is None else f"{v:.1%}",
                        None if v is None else v >= 0.95,
                    )
                )
    m = sc.get("memory")
    if m:
        a = (m["array"].get("hwm_kib") or {}).get("median")
        rows.append(
            (
                f"server memory, {m['array']['tasks']:,}-task array, no workers: ≤ 200 MiB",
                f"VmHWM {mib(a)} MiB",
                None if a is None else a <= 200 * 1024,
            )
        )
        b = (m["each"].get("hwm_kib") or {}).get("median")
        rows.append(
            (
                f"server memory, {m['each']['tasks']:,} distinct command lines: ≤ 1 GiB",
                f"VmHWM {mib(b)} MiB",
                None if b is None else b <= 1024 * 1024,
            )
        )
    w = sc.get("workers")
    if w:
        k, ref = med(w), w.get("ref_rate")
        r = ratio(k, ref)
        label = f"{w['workers']} workers, {w['tasks']:,} noop tasks: ≥ 80% of the 2-worker rate"
        rows.append(
            (
                label,
                f"{r:.0%} ({fmt_rate(k)} vs {fmt_rate(ref)} tasks/s)"
                if r
                else f"{fmt_rate(k)} tasks/s",
                None if r is None else r >= 0.8,
            )
        )
    j = sc.get("journal")
    if j:
        for kind, n, want in [("noop", j["noop_tasks"], 0.5), ("true", j["true_tasks"], 0.9)]:
            on, off = med(j.get(f"{kind}_on")), med(j.get(f"{kind}_off"))
            r = ratio(on, off)
            what = "noop" if kind == "noop" else "/bin/true"
            rows.append(
                (
                    f"journal on, {n:,} {what} tasks: ≥ {want:.0%} of the in-memory rate",
                    f"{r:.0%} ({fmt_rate(on)} vs {fmt_rate(off)} tasks/s)" if r else "—",
                    None if r is None else r >= want,
                )
            )
        rs = (j.get("restart") or {}).get("dispatch_s") or {}
        v = rs.get("median")
        nr = j["restart"]["tasks"]
        rows.append(
            (
                f"restart with {nr:,} finished + {nr:,} queued tasks: dispatching ≤ 10 s",
                "—" if v is None else f"{v:.2f} s",
                None if v is None else v <= 10,
            )
        )
    return rows


def report(res: dict, doc: Path, png: Path) -> None:
    sc, m, kb = res["scenarios"], res["machine"], res["kestrel"]
    plot_err = plot(res, png)
    chaos_plot(res, png.with_name("chaos.png"))
    L: list[str] = []
    a = L.append
    cmd = res["command"]
    a("# Kestrel benchmarks\n")
    a(
        "Kestrel against `xargs -P 2` (the machine's own spawn rate, no engine), HyperQueue, Dask "
        "and Parsl, all measured in the same invocation on the same machine. This file and "
        f"[benchmarks.png]({png.name}) are written by the suite; do not edit the numbers by hand. "
        "To reproduce:\n"
    )
    a(
        "```sh\npython3 bench/run.py              # everything: build, Kestrel, peers, this report"
        "\npython3 bench/run.py --quick      # smoke test: small counts, 1 run, no peers (~1 min)"
        "\npython3 bench/run.py --runs 5 --only true,noop\n```\n"
    )
    a(
        f"This report: `{cmd}`, {res['cfg']['runs']} run(s) of every figure; "
        "tables give the **median** and the min – max over the runs. "
        f"Raw samples: `{res.get('raw', 'bench/results/latest.json')}`. Suite wall time {res['elapsed_s'] / 60:.0f} "
        "min.\n"
    )
    a("## Machine\n")
    a("| | |\n|---|---|")
    a(f"| date | {m['date']} |")
    a(f"| `nproc` | {m['nproc']} |")
    a(f"| CPU | {m['cpu']} |")
    a(f"| kernel | {m['kernel']} ({m['os']}) |")
    a(f"| memory | {m['memory']} |")
    a(f"| load average at start | {' '.join(m['load_at_start'])} |")
    a(
        f"| Kestrel | {kb['version']}, commit {kb['commit']}"
        f"{' + uncommitted changes' if kb['dirty'] else ''}, release build of {kb['built']} "
        f"(sha256 {kb['sha256']}…) |"
    )
    a(
        f"| Python | {m['python']}; peers: hyperqueue 0.27.0, dask/distributed 2026.8.0, parsl "
        "2026.10.26 (pinned by peers.py) |\n"
    )
    a(
        "The machine is a shared 2-core VM and is noisy: other builds may run at the same time. "
        "Each sample records the 1-minute load average and any compiler/test processes seen when it "
        "started (in the raw results)."
    )
    samples = list(_all_samples(res))
    busy = sorted({b for s in samples for b in s.get("others_busy", [])})
    waited = sum(s.get("waited_s", 0) for s in samples)
    loud = [s for s in samples if s.get("busy_cores_before", 0) > Quiet.THRESHOLD]
    a(
        f" Before each sample the suite waits (up to 3 min) until other processes use less "
        f"than {Quiet.THRESHOLD} cores; in this run it waited {waited / 60:.1f} min in all, and "
        f"{len(loud)} of {len(samples)} samples started while others still used more."
    )
    if busy:
        a(f" Other people's processes seen at the start of some samples: {', '.join(busy)}.")
    a("")
    a("## Targets\n")
    a("| target | measured (median) | |\n|---|---|---|")
    for name, val, ok in targets(res):
        a(f"| {name} | {val} | {verdict(ok)} |")
    a("")

    t = sc.get("true")
    if t:
        a(f"## 1. Spawning `/bin/true`: {t['tasks']:,} tasks on {t['slots']} slots\n")
        a(
            "| system | tasks | median s | median tasks/s | min – max tasks/s | runs | Kestrel "
            "`run` / this | Kestrel server+worker / this | CPU µs per task |"
        )
        a("|---|---|---|---|---|---|---|---|---|")
        kr, ks = med(t["kestrel_run"]), med(t["kestrel_submit"])

        def line(name: str, fig: dict | None, tasks: int) -> None:
            r = med(fig)
            rr, rs = ratio(kr, r), ratio(ks, r)
            cells = rate_cells(fig)
            cpu = [_cpu_total(x) for x in (fig or {}).get("samples", [])]
            cpu = [c for c in cpu if c is not None]
            per = f"{statistics.median(cpu) / tasks * 1e6:,.0f}" if cpu else "—"
            a(
                f"| {name} | {tasks:,} | {' | '.join(cells)} | "
                f"{'—' if rr is None else f'{rr:.2f}'} | {'—' if rs is None else f'{rs:.2f}'} | "
                f"{per} |"
            )

        line("**Kestrel** `kestrel run` (embedded)", t["kestrel_run"], t["tasks"])
        line("**Kestrel** server + 1 worker, `submit --wait`", t["kestrel_submit"], t["tasks"])
        if t.get("xargs"):
            line("xargs -P 2", t["xargs"], t["tasks"])
        for key in ["hyperqueue/true", "dask/true", "parsl/true"]:
            fig = t["peers"].get(key)
            if fig:
                line(key.split("/")[0], fig, t["peer_tasks"])
        a("")
        if t["peers_enabled"] and t["peer_tasks"] != t["tasks"]:
            pr = [med(f) for k, f in t["peers"].items() if k.endswith("/true") and med(f)]
            if pr:
                a(
                    f"HyperQueue, Dask and Parsl ran {t['peer_tasks']:,} tasks, not "
                    f"{t['tasks']:,}: at their measured rates ({fmt_rate(min(pr))}–"
                    f"{fmt_rate(max(pr))} tasks/s) {t['tasks']:,} tasks would take "
                    f"{t['tasks'] / max(pr) / 60:.0f}–{t['tasks'] / min(pr) / 60:.0f} minutes per "
                    f"run and peer. Kestrel's and xargs' rates at {t['peer_tasks']:,} tasks are in "
                    "the next table, for a comparison at equal counts.\n"
                )
        a(
            "*CPU µs per task*: user + system CPU of every process involved (engine, client "
            "and the `/bin/true` processes), per task; 2 cores give at most 2 CPU-seconds per "
            "second, so on this machine CPU per task bounds the rate. Not measured for the "
            "Python peers (it would include their cluster's start-up).\n"
        )
        _errors(a, t)
        a("Rate against task count (`/bin/true`, 2 slots):\n")
        a(
            "| tasks | Kestrel server+worker median tasks/s (min – max) | xargs -P 2 median tasks/s "
            "(min – max) | Kestrel / xargs |"
        )
        a("|---|---|---|---|")
        rows = dict(t["counts"])
        rows[str(t["tasks"])] = {"kestrel_submit": t["kestrel_submit"], "xargs": t.get("xargs")}
        for cnt in sorted(rows, key=int):
            kf, xf = rows[cnt]["kestrel_submit"], rows[cnt].get("xargs")
            r = ratio(med(kf), med(xf))
            a(f"| {int(cnt):,} | {_rmm(kf)} | {_rmm(xf)} | {'—' if r is None else f'{r:.2f}'} |")
        a("")
        cpu = [s["cpu"] for s in t["kestrel_submit"]["samples"] if "cpu" in s]
        if cpu:
            n = t["tasks"]
            c = {k: statistics.median(x[k] for x in cpu) for k in cpu[0]}
            a(
                f"Where the CPU went in the server + worker runs (median over runs, {n:,} tasks; "
                "2 cores give 2 CPU-seconds per second): server "
                f"{c['server_s']:.1f} s ({c['server_s'] / n * 1e6:.0f} µs/task), worker process "
                f"{c['worker_s']:.1f} s ({c['worker_s'] / n * 1e6:.0f} µs/task), the `/bin/true` "
                f"processes {c['tasks_s']:.1f} s ({c['tasks_s'] / n * 1e6:.0f} µs/task), the "
                f"submitting client {c['submit_s']:.1f} s.\n"
            )

    n = sc.get("noop")
    if n:
        a("## 2. The dispatch path alone: `--exec noop` workers\n")
        a(
            f"{n['workers']} `kestrel worker start --exec noop` processes connected to a standalone "
            "server; the figure is the wall time of `kestrel submit --array 1-N --wait` (submission, "
            "dispatch, completion reports, and the client seeing the job done). Noop tasks use no "
            "CPU, so `--slots` only sizes the credit window (slots + prefetch tasks in flight per "
            f"worker). One run of {n['sweep_tasks']:,} tasks for each value:\n"
        )
        a("| --slots (= --prefetch) per worker | tasks in flight | seconds | tasks/s |")
        a("|---|---|---|---|")
        for s in n["sweep"]:
            if "error" in s:
                a(f"| {s.get('slots')} | | failed: {s['error'][:120]} | |")
            else:
                a(
                    f"| {s['slots']} | {2 * s['slots'] * n['workers']:,} | {s['seconds']:.3f} | "
                    f"{fmt_rate(s['rate'])} |"
                )
        a(
            f"\nChosen: **--slots {n['slots']}** (prefetch defaults to slots) per worker, the "
            "fastest of the sweep; every count below uses it.\n"
        )
        a("| tasks | median s | median tasks/s | min – max tasks/s | runs | server CPU µs/task |")
        a("|---|---|---|---|---|---|")
        for cnt in sorted(n["counts"], key=int):
            fig = n["counts"][cnt]
            cpu = [s["cpu"]["server_s"] for s in fig["samples"] if "cpu" in s]
            per = f"{statistics.median(cpu) / int(cnt) * 1e6:.2f}" if cpu else "—"
            a(f"| {int(cnt):,} | {' | '.join(rate_cells(fig))} | {per} |")
        a("")
        a(
            "Small counts are dominated by fixed costs (starting the `kestrel submit` process, "
            "connecting, the handshake), so the rate grows with the task count."
        )
        pn = [
            (k, v)
            for k, v in (sc.get("true") or {}).get("peers", {}).items()
            if k.endswith("/noop")
        ]
        if pn:
            a(
                " For scale, the peers' Python-function no-op workloads from the same run "
                "(a function returning its argument, not a command line):\n"
            )
            a("| peer | tasks | median s | median tasks/s | min – max tasks/s | runs |")
            a("|---|---|---|---|---|---|")
            for k, v in pn:
                a(
                    f"| {k.split('/')[0]} (python function) | {sc['true']['peer_tasks']:,} | "
                    f"{' | '.join(rate_cells(v))} |"
                )
        a("")
        for cnt in n["counts"]:
            for e in n["counts"][cnt]["errors"]:
                a(f"- error: {e[:400]}")
        a("")

    e = sc.get("efficiency")
    if e:
        a(f"## 3. Efficiency against task length ({e['slots']} slots)\n")
        a(
            "Efficiency = ideal time (tasks × length / slots) / measured wall time of `kestrel "
            "submit --wait` against a server with one `--slots 2` worker already connected. "
            "`sleep` itself costs a process spawn (and `sleep` start-up) per task; it is "
            "reported as is. *Run time* is Kestrel's own measure (from `kestrel job info`) of how "
            "long each task's process lived.\n"
        )
        a(
            "| task | tasks | ideal s | median wall s | median efficiency | min – max | runs | "
            "mean task run time | slot occupancy |"
        )
        a("|---|---|---|---|---|---|---|---|---|")
        for row in e["rows"]:
            ef = row.get("efficiency") or {}
            rt = row.get("mean_run_ms")
            wall = med(row, "seconds")
            occ = row["tasks"] * rt / 1000 / (e["slots"] * wall) if rt and wall else None
            a(
                f"| `sleep {row['length_s']:g}` | {row['tasks']:,} | {row['ideal_s']:.1f} | "
                f"{fmt_s(med(row, 'seconds'))} | "
                f"{'—' if not ef else format(ef['median'], '.1%')} | "
                f"{'—' if not ef else format(ef['min'], '.1%') + ' – ' + format(ef['max'], '.1%')}"
                f" | {ef.get('n', 0)} | {'—' if rt is None else f'{rt:.1f} ms'} | "
                f"{'—' if occ is None else f'{occ:.1%}'} |"
            )
        a(
            "\n*Slot occupancy* = tasks × mean task run time / (slots × wall time): the share of "
            "the wall time the slots held a live task process, as Kestrel's worker times it. "
            "100% − occupancy is time a slot held no task (Kestrel's gap between one task and "
            "the next); occupancy − efficiency is the task's own cost beyond its nominal length "
            "(starting the `sleep` process).\n"
        )
        for row in e["rows"]:
            for err in row["errors"]:
                a(f"- error: {err[:400]}")

    mm = sc.get("memory")
    if mm:
        a("## 4. Server memory\n")
        a(
            "VmRSS and VmHWM (peak) from `/proc/<pid>/status` of the `kestrel server start` "
            "process, no workers connected: idle (1 s after start), then 1 s after `kestrel "
            "submit` (without `--wait`) returned, and again after a `kestrel job list` that checks "
            "the server holds every task.\n"
        )
        a(
            "| submission | submit s | idle VmRSS MiB | VmRSS MiB after submit | VmHWM MiB "
            "(min – max) | VmHWM MiB after job list | runs |"
        )
        a("|---|---|---|---|---|---|---|")
        for kind, label in [
            ("array", "`--array 1-{n}` of `/bin/true`"),
            ("each", "`--each` file of {n} lines, `echo {{line}}`"),
        ]:
            fig = mm[kind]
            hw = fig.get("hwm_kib") or {}
            count = f"{fig['tasks']:,}"
            a(
                f"| {label.format(n=count)} | {fmt_s(med(fig, 'seconds'))} | "
                f"{mib(med(fig, 'idle_rss_kib'))} | {mib(med(fig, 'rss_kib'))} | "
                f"{mib(hw.get('median'))} ({mib(hw.get('min'))} – {mib(hw.get('max'))}) | "
                f"{mib(med(fig, 'hwm_after_job_list_kib'))} | {hw.get('n', 0)} |"
            )
        a("\nThe `--each` lines are `input-000001.dat` … (one distinct argv per task).\n")
        for kind in mm:
            for err in mm[kind]["errors"]:
                a(f"- error: {err[:400]}")

    w = sc.get("workers")
    if w:
        a(f"## 5. {w['workers']} workers\n")
        sweep_txt = ", ".join(
            f"`--slots {x['slots']}` {fmt_rate(x.get('rate'))}" for x in w.get("sweep", [])
        )
        a(
            f"{w['workers']} `kestrel worker start --exec noop --slots {w['slots']}` processes "
            f"(prefetch = slots, so {2 * w['slots'] * w['workers']:,} tasks in flight), all on "
            "loopback, waited for until `kestrel worker list --output json` lists them all; then "
            f"`kestrel submit --array 1-{w['tasks']} --wait` is timed. As scenario 2 sweeps "
            "`--slots` for its 2 workers, a one-run sweep picks the 200 workers' `--slots` "
            f"(sweep: {sweep_txt} tasks/s).\n"
        )
        sw = w.get("same_window")
        if sw:
            cells = [
                f"{k} workers × `--slots {sw['total_slots'] // int(k)}`: "
                f"{fmt_rate(x.get('rate'))} tasks/s"
                for k, x in sw["runs"].items()
            ]
            a(
                f"With the same total window ({2 * sw['total_slots']:,} tasks in flight) for both "
                f"(one run each): {'; '.join(cells)}. The window, not the number of workers, sets "
                "the rate: each worker then gets a few tasks per round trip.\n"
            )
        ok = [s for s in w["samples"] if "error" not in s]
        a("| figure | median | min – max |\n|---|---|---|")
        a(f"| tasks/s | {fmt_rate(med(w))} | {_mm(w.get('rate'))} |")
        a(
            f"| seconds | {fmt_s(med(w, 'seconds'))} | "
            f"{fmt_s((w.get('seconds') or {}).get('min'))} – "
            f"{fmt_s((w.get('seconds') or {}).get('max'))} |"
        )
        if w.get("ref_rate"):
            r = ratio(med(w), w["ref_rate"])
            a(f"| / 2-worker rate ({fmt_rate(w['ref_rate'])} tasks/s) | {r:.0%} | |")
        for key, label, f in [
            ("connect_s", "time for all workers to connect (s)", fmt_s),
            ("workers_rss_kib", "total RSS of the worker processes (MiB)", mib),
        ]:
            vals = [s[key] for s in ok if key in s]
            if vals:
                a(f"| {label} | {f(statistics.median(vals))} | {f(min(vals))} – {f(max(vals))} |")
        per = [s["per_worker_finished"] for s in ok if "per_worker_finished" in s]
        if per:
            a(
                f"| tasks per worker (fewest – most), idle workers | "
                f"{per[0]['min']:,} – {per[0]['max']:,}, {per[0]['idle_workers']} idle (run 1) | |"
            )
        cpu = [s["cpu"]["server_s"] for s in ok if "cpu" in s]
        if cpu:
            a(f"| server CPU µs/task | {statistics.median(cpu) / w['tasks'] * 1e6:.2f} | |")
        a("")
        for err in w["errors"]:
            a(f"- error: {err[:400]}")

    a("## Plot\n")
    if plot_err:
        a(f"No plot: {plot_err}\n")
    else:
        a(f"![rate against task count, and efficiency against task length]({png.name})\n")
    j = sc.get("journal")
    if j:
        a("## The journal (issue 4)\n")
        a(
            "The same runs with the server's journal on (the default: SQLite in WAL mode, "
            "`synchronous=FULL`, group commit) and off (`kestrel server start --no-journal`).\n"
        )
        a("| workload | journal | tasks/s (median) | min – max | journal size | bytes/task |")
        a("|---|---|---:|---|---:|---:|")
        for kind, n in [("noop", j["noop_tasks"]), ("true", j["true_tasks"])]:
            for mode in ("on", "off"):
                f = j.get(f"{kind}_{mode}") or {}
                jb = (f.get("journal_bytes") or {}).get("median")
                what = (
                    f"{n:,} noop tasks, 2 workers"
                    if kind == "noop"
                    else f"{n:,} /bin/true, 1 worker × 2 slots"
                )
                a(
                    f"| {what} | {mode} | {fmt_rate(med(f))} | {_mm(f.get('rate'))} | "
                    f"{'—' if not jb else f'{jb / 2**20:.1f} MiB'} | "
                    f"{'—' if not jb else f'{jb / n:.1f}'} |"
                )
        rs = j.get("restart") or {}
        if rs.get("dispatch_s"):
            n = rs["tasks"]
            a(
                f"\n**Restart** of a server killed with SIGKILL whose journal holds {n:,} finished "
                f"and {n:,} queued tasks (journal {rs['journal_bytes']['median'] / 2**20:.1f} MiB): "
                f"it answers clients after {rs['ready_s']['median']:.2f} s (min – max "
                f"{rs['ready_s']['min']:.2f} – {rs['ready_s']['max']:.2f}) and has dispatched and "
                f"finished its first task on a newly started worker after "
                f"{rs['dispatch_s']['median']:.2f} s (median of {rs['dispatch_s']['n']}); the "
                f"server's own replay log lines: "
                f"{', '.join(str(x.get('replay')) for x in rs['samples'] if 'error' not in x)}.\n"
            )
    ch = sc.get("chaos")
    if ch:
        a("## Chaos test (issue 4)\n")
        a(
            "`cargo test --release -p kestrel-cli --test chaos`: a server and 4 workers, 20,000 "
            "tasks that each append their id to their own file and sleep 0–20 ms; a random worker "
            "is SIGKILLed and replaced every second, and the server is SIGKILLed and restarted "
            "twice. The test checks that the journal records every task finished exactly once "
            "and that every task's file exists.\n"
        )
        a(f"Result of this run: `{ch['summary']}`\n")
        a("![completed tasks over time through the chaos test](chaos.png)\n")
    a("## How each figure was measured\n")
    a(
        "- Everything runs on this one machine with 2 task slots; every server listens on "
        "127.0.0.1 and gets a fresh temporary `--server-dir` per run; the suite copies the "
        "release binary once, so a rebuild during the suite changes nothing. Wall times are taken "
        "by the suite around the timed command (`time.perf_counter`), so they include starting "
        "that process."
    )
    a(
        "- **Kestrel `run`**: `kestrel run --slots 2 --stdout none --stderr none --array 1-N "
        "--quiet --output json -- /bin/true`, timed whole (embedded server and worker start-up "
        "included)."
    )
    a(
        "- **Kestrel server + worker**: `kestrel server start --host 127.0.0.1`, one `kestrel "
        "worker start --slots 2` (prefetch 2, the default), wait until `kestrel worker list` shows "
        "it, then time `kestrel submit --output json --array 1-N --stdout none --stderr none "
        "--wait -- /bin/true`. CPU per process from `/proc/<pid>/stat` before and after."
    )
    a(
        "- **Peers**: `python3 ../shared/anchors/peers.py --only PEER --tasks N --slots 2 --json "
        "FILE`, once per run and peer, interleaved with Kestrel's runs. xargs is "
        "`seq N | xargs -P 2 -n 1 /bin/true`; HyperQueue is its Python API (`LocalCluster`, one "
        "worker with 2 cores, one `program` task per command, no stdout/stderr); Dask is a "
        "`LocalCluster` of 2 single-thread worker processes whose task calls `subprocess.run("
        "['/bin/true'])`; Parsl is a `HighThroughputExecutor` with 2 workers running a "
        "`bash_app`. peers.py times only the submission-to-completion part (cluster start-up "
        "excluded; Dask and Parsl get a 50-task warm-up first). Dask and Parsl also run a "
        "Python-function no-op."
    )
    a(
        "- **noop**: like the server + worker runs, with `kestrel worker start --exec noop "
        "--slots S` workers; the sweep picks S."
    )
    a(
        "- **Efficiency**: `kestrel submit --array 1-N --stdout none --stderr none --wait -- "
        "sleep L` against a server with one `--slots 2` worker; ideal = N × L / 2."
    )
    a(
        f"- **Memory**: `kestrel submit --array 1-{res['cfg']['mem_array']} --stdout none "
        "--stderr none -- /bin/true` and `kestrel submit --each FILE --stdout none --stderr none -- echo {line}`, "
        "no workers; VmRSS/VmHWM read from `/proc/<server pid>/status`."
    )
    a("- **Workers**: as noop, with many worker processes started at once.")
    a(
        "- A failure of any measurement (a peer that cannot install or run, a Kestrel error) is "
        "recorded in the results and listed under its table instead of stopping the suite.\n"
    )
    if res.get("setup_errors"):
        a("## Set-up problems\n")
        for err in res["setup_errors"]:
            a(f"- {err}")
        a("")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(L).rstrip() + "\n")
    log(f"wrote {doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc}")


def _cpu_total(s: dict) -> float | None:
    if "cpu" in s and isinstance(s["cpu"], dict):
        return sum(v for v in s["cpu"].values() if isinstance(v, int | float))
    return s.get("cpu_s")


def _rmm(fig: dict | None) -> str:
    r = med(fig)
    return "—" if r is None else f"{fmt_rate(r)} ({_mm(fig['rate'])})"


def _mm(r: dict | None) -> str:
    return "—" if not r else f"{fmt_rate(r['min'])} – {fmt_rate(r['max'])}"


def _errors(a, t: dict) -> None:
    errs = []
    for key in ("kestrel_run", "kestrel_submit", "xargs"):
        if t.get(key):
            errs += t[key]["errors"]
    for k, v in t["peers"].items():
        errs += [f"{k}: {e}" for e in v["errors"]]
    if errs:
        a("Failures recorded in this run:\n")
        for e in errs:
            a(f"- `{e[:500].replace('`', '')}`".replace("\n", " "))
        a("")


def _all_samples(res: dict):
    def walk(x):
        if isinstance(x, dict):
            if "samples" in x:
                yield from x["samples"]
            for v in x.values():
                yield from walk(v)
        elif isinstance(x, list):
            for v in x:
                yield from walk(v)

    yield from walk(res["scenarios"])


def plot(res: dict, png: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib is not available ({e})"
    sc = res["scenarios"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
    t, n = sc.get("true"), sc.get("noop")

    def series(ax, pts, label, style):
        pts = sorted((c, r) for c, r in pts if r)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, lw=2, ms=7)

    if n:
        series(
            ax1,
            [(int(c), med(f)) for c, f in n["counts"].items()],
            f"Kestrel noop ({n['workers']} workers, dispatch only)",
            "o-",
        )
    if t:
        kc = [(int(c), med(f["kestrel_submit"])) for c, f in t["counts"].items()]
        kc.append((t["tasks"], med(t["kestrel_submit"])))
        series(ax1, kc, "Kestrel /bin/true (server + worker)", "s-")
        series(ax1, [(t["tasks"], med(t["kestrel_run"]))], "Kestrel /bin/true (`kestrel run`)", "D")
        xc = [(int(c), med(f.get("xargs"))) for c, f in t["counts"].items()]
        xc.append((t["tasks"], med(t.get("xargs"))))
        series(ax1, xc, "xargs -P 2 /bin/true", "^--")
        styles = {"hyperqueue": "v", "dask": "P", "parsl": "X"}
        for key, f in t["peers"].items():
            p, kind = key.split("/")
            what = "/bin/true" if kind == "true" else "python no-op"
            series(
                ax1,
                [(t["peer_tasks"], med(f))],
                f"{p} {what} ({t['peer_tasks']:,} tasks)",
                styles.get(p, "o"),
            )
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("tasks in the job")
    ax1.set_ylabel("tasks per second (median, end to end)")
    ax1.set_title("Throughput against task count (2 slots)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, loc="best")
    e = sc.get("efficiency")
    if e:
        pts = [(r["length_s"], (r.get("efficiency") or {})) for r in e["rows"]]
        pts = [(x, y) for x, y in pts if y]
        if pts:
            xs = [p[0] for p in pts]
            ys = [p[1]["median"] * 100 for p in pts]
            lo = [y - p[1]["min"] * 100 for y, p in zip(ys, pts)]
            hi = [p[1]["max"] * 100 - y for y, p in zip(ys, pts)]
            ax2.errorbar(
                xs,
                ys,
                yerr=[lo, hi],
                fmt="o-",
                lw=2,
                ms=7,
                capsize=4,
                label="Kestrel, sleep tasks (median, min–max)",
            )
            for x, y in zip(xs, ys):
                ax2.annotate(f"{y:.1f}%", (x, y), textcoords="offset points", xytext=(6, -14))
        ax2.axhline(100, color="gray", lw=1)
        ax2.axhline(95, color="red", ls="--", lw=1, label="target at 100 ms: 95%")
        ax2.set_xscale("log")
        ax2.set_ylim(0, 105)
        ax2.set_xlabel("task length (s)")
        ax2.set_ylabel("efficiency: ideal / measured wall time (%)")
        ax2.set_title("Efficiency against task length (2 slots)")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=8, loc="lower right")
    fig.suptitle(
        f"Kestrel benchmarks — {res['machine']['date']}, {res['machine']['nproc']} "
        f"cores, {res['machine']['cpu']}",
        fontsize=10,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return None


def chaos_plot(res: dict, png: Path) -> None:
    ch = res["scenarios"].get("chaos")
    if not ch:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 4.2))
    pts = [(t, n) for t, n, ev in ch["timeline"] if ev != "server killed"]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", lw=2, label="tasks finished")
    kills = [t for t, _, ev in ch["timeline"] if ev == "server killed"]
    for i, t in enumerate(kills):
        ax.axvline(t, color="red", ls="--", lw=1, label="server SIGKILLed" if i == 0 else None)
    ax.set_xlabel("seconds since submission")
    ax.set_ylabel("tasks finished (as the server reports)")
    ax.set_title("Chaos test: a worker killed every second, the server killed twice")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# ----- main ------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int)
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--peer-tasks", type=int)
    ap.add_argument("--peer-timeout", type=float, default=3600)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument(
        "--idle-wait",
        type=float,
        default=1200,
        help="seconds in all to wait for other CPU users to finish (default 1200)",
    )
    ap.add_argument("--build-retries", type=int, default=5)
    ap.add_argument("--doc", type=Path, help="report path (default: see above)")
    ap.add_argument("--report", type=Path, help="rewrite the report from this raw results file")
    args = ap.parse_args()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario(s) {bad}; choose from {SCENARIOS}")
    full = set(only) == set(SCENARIOS) and not args.quick
    doc = args.doc or (DOC if full else RESULTS / ("quick.md" if args.quick else "partial.md"))
    doc = doc.resolve()
    png = doc.with_suffix(".png")

    plot_err = ensure_matplotlib()
    if plot_err:
        log(f"warning: {plot_err}; the report will have no plot")

    if args.report:
        res = json.loads(args.report.read_text())
        report(res, doc, png)
        return 0

    cfg = dict(QUICK if args.quick else FULL)
    if args.runs:
        cfg["runs"] = args.runs
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    atexit.register(PROCS.stop_all)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    if not args.no_build:
        build(args.build_retries)
    root = Path(tempfile.mkdtemp(prefix="kestrel-bench-"))
    res: dict = {
        "command": "python3 bench/run.py " + " ".join(sys.argv[1:]),
        "cfg": cfg,
        "only": only,
        "setup_errors": [],
        "scenarios": {},
    }
    if plot_err:
        res["setup_errors"].append(plot_err)
    try:
        kbin, res["kestrel"] = kestrel_copy(root)
        res["machine"] = machine()
        log(
            f"kestrel {res['kestrel']['version']} commit {res['kestrel']['commit']}; "
            f"{res['machine']['nproc']} CPUs, {res['machine']['cpu']}; scratch {root}"
        )
        suite = Suite(args, cfg, kbin, root)
        for name in SCENARIOS:
            if name in only:
                try:
                    getattr(suite, f"scenario_{name}")()
                except Exception as e:  # noqa: BLE001 - the other scenarios still run
                    log(f"scenario {name} FAILED: {e}")
                    res["setup_errors"].append(f"scenario {name}: {e}")
                res["scenarios"] = suite.res
        res["elapsed_s"] = time.monotonic() - T0
        if suite.peer_dead:
            res["setup_errors"] += [f"peer {k}: {v}" for k, v in suite.peer_dead.items()]
    finally:
        PROCS.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    raw = RESULTS / f"{stamp}{'-quick' if args.quick else ''}.json"
    res["raw"] = "bench/results/latest.json" if full else str(raw.relative_to(REPO))
    raw.write_text(json.dumps(res, indent=1))
    log(f"raw results: {raw.relative_to(REPO)}")
    if full:
        (RESULTS / "latest.json").write_text(json.dumps(res, indent=1))
    report(res, doc, png)
    rows = targets(res)
    for name, val, ok in rows:
        log(f"{verdict(ok).strip('*'):4} {name}: {val}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
