#!/usr/bin/env python3
"""Kestrel's Python package against Dask, Ray and Parsl on the same machine (issue 31).

    python3 bench/python_futures.py [--runs 3] [--only kestrel,dask,ray,parsl] [--no-build]
                                    [--out bench/results/python.json]
    python3 bench/python_futures.py --report bench/results/python.json   # only rewrite the doc
    python3 bench/python_futures.py --redo-stream [--no-build]   # the stream again, the rest kept
    python3 bench/python_futures.py --redo-value [--no-build]    # the value again, the rest kept

Each run starts, for each engine in turn (the order rotates between runs), a fresh process of
`bench/python_workloads.py ENGINE suite`, which starts a fresh local cluster of 2 slots and
measures on it: `map`, no-op function calls through the engine's map (Kestrel --tasks calls,
the peers --peer-tasks: at their rate a run of 100,000 takes minutes, and their rate does not
rise with the count); `latency`, --calls sequential `submit(noop).result()` round trips on the
idle cluster, each timed; `chain`, --links calls each taking the previous one's future; and for
Kestrel `commands`, --commands `/bin/true` tasks from Python (`client.map_commands`) with,
right after on the same cluster, `cli`, the same tasks from `kestrel submit --array --wait`.
`xargs -P 2 /bin/true` gives the machine's own spawn rate in each run. Each run also measures
`value` for Kestrel and Dask (in turn, the order rotating): on a fresh cluster of
--value-workers one-slot workers, a --value-mb MB result consumed by as many calls, one on
the worker holding it and the others elsewhere, with the bytes through the server (Kestrel's
own count, and for both engines what the kernel counts on the server's or scheduler's TCP
connections). After the runs, one `stream`: --stream items of a generator through
`client.map`, each result read and dropped, with the client's peak RSS and the server's and
worker's peak memory (VmHWM).

Kestrel runs from a venv of its own with the package as a user installs it (`pip install
./python`, target/bench-py-venv; --no-build keeps the one there); the peers from the venv of
../shared/anchors/peers.py, with Ray added to it. Writes the raw results as JSON,
docs/benchmarks-python.md, and that page's copy in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kbench.common import DOC, PEERS_PY, REPO, RESULTS, log
from kbench.machine import machine
from kbench.report import splice_section

WORKLOADS = REPO / "bench" / "python_workloads.py"
VENV = REPO / "target" / "bench-py-venv"
PART_DOC = DOC.with_name("benchmarks-python.md")
TITLE = "Python: futures, map and commands against Dask, Ray and Parsl (issue 31)"
ENGINES = ["kestrel", "dask", "ray", "parsl"]
RAY_PIN = "ray==2.52.1"
SLOTS = 2


def kestrel_python(build: bool) -> Path:
    py = VENV / "bin" / "python"
    if build or not py.exists():
        log(f"pip install ./python into {VENV.relative_to(REPO)} (a release build: minutes)")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "--force-reinstall", "--no-deps", "./python"], cwd=REPO, check=True)
        subprocess.run([*pip, "cloudpickle==3.1.3"], cwd=REPO, check=True)
    return py


def peers_python() -> Path:
    """The peers' venv (made by peers.py's own set-up), with Ray added."""
    sys.path.insert(0, str(PEERS_PY.parent))
    import peers

    _, py = peers.ensure_venv()
    has_ray = subprocess.run([py, "-c", "import ray"], check=False, capture_output=True)
    if has_ray.returncode != 0:
        log(f"pip install {RAY_PIN} into the peers' venv")
        subprocess.run([py, "-m", "pip", "install", "--quiet", RAY_PIN], check=True)
    return Path(py)


def child(py: Path, engine: str, workload: str, a, timeout: float = 3600) -> dict:
    argv = [
        str(py),
        str(WORKLOADS),
        engine,
        workload,
        "--slots",
        str(SLOTS),
        "--tasks",
        str(a.stream if workload == "stream" else a.tasks),
        "--peer-tasks",
        str(a.peer_tasks),
        "--calls",
        str(a.calls),
        "--links",
        str(a.links),
        "--commands",
        str(a.commands if engine == "kestrel" else 0),
        "--value-mb",
        str(a.value_mb),
        "--value-workers",
        str(a.value_workers),
    ]
    # The venv's own bin first: Parsl starts its interchange by name from there.
    env = dict(os.environ, PATH=f"{py.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    t = time.perf_counter()
    p = subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=timeout, cwd="/tmp", env=env
    )
    if p.returncode != 0:
        tail = (p.stderr or p.stdout)[-3000:]
        raise RuntimeError(f"{engine} {workload} failed ({p.returncode}):\n{tail}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["process_s"] = round(time.perf_counter() - t, 2)
    return out


def xargs_true(n: int) -> dict:
    t = time.perf_counter()
    subprocess.run(f"seq {n} | xargs -P {SLOTS} -n 1 /bin/true", shell=True, check=True)
    s = time.perf_counter() - t
    return {"tasks": n, "seconds": round(s, 3), "tasks_per_s": round(n / s, 1)}


def measure(a) -> dict:
    only = [e for e in a.only.split(",") if e]
    kpy = (a.kestrel_python and a.kestrel_python.absolute()) or (
        kestrel_python(not a.no_build) if "kestrel" in only else None
    )
    ppy = peers_python() if set(only) - {"kestrel"} else None
    res: dict = {
        "machine": machine(),
        "params": {k: getattr(a, k) for k in ("runs", "tasks", "peer_tasks", "calls", "links")}
        | {"commands": a.commands, "stream": a.stream, "slots": SLOTS}
        | {"value_mb": a.value_mb, "value_workers": a.value_workers},
        "runs": [],
    }
    for r in range(a.runs):
        order = only[r % len(only) :] + only[: r % len(only)]
        run: dict = {}
        for engine in order:
            log(f"run {r + 1}/{a.runs}: {engine}")
            py = kpy if engine == "kestrel" else ppy
            try:
                run[engine] = child(py, engine, "suite", a)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                log(f"{engine} failed: {e}")
                run[engine] = {"error": str(e)[-3000:]}
        if a.commands:
            run["xargs"] = xargs_true(a.commands)
        measure_value(a, run, r, kpy, ppy, only)
        res["runs"].append(run)
    if kpy is not None and a.stream:
        log(f"stream: {a.stream:,} generator items through client.map")
        try:
            res["stream"] = child(kpy, "kestrel", "stream", a, timeout=7200)["stream"]
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            res["stream"] = {"error": str(e)[-3000:]}
    return res


def measure_value(a, run: dict, r: int, kpy: Path | None, ppy: Path | None, only: list) -> None:
    """Run `r`'s `value` workload for Kestrel and Dask (those of `only`), into `run`."""
    engines = [e for e in ("kestrel", "dask") if e in only and a.value_mb]
    for engine in engines[r % 2 :] + engines[: r % 2]:
        log(f"run {r + 1}/{a.runs}: {engine} value ({a.value_mb} MB)")
        py = kpy if engine == "kestrel" else ppy
        try:
            value = child(py, engine, "value", a, timeout=1200)["value"]
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            log(f"{engine} value failed: {e}")
            value = {"error": str(e)[-3000:]}
        run.setdefault(engine, {})["value"] = value


# ----- the report -----------------------------------------------------------------------------


def figures(res: dict, engine: str, path: list[str]) -> list[float]:
    out = []
    for run in res["runs"]:
        x = run.get(engine)
        for key in path:
            x = x.get(key) if isinstance(x, dict) else None
        if isinstance(x, (int, float)):
            out.append(float(x))
    return out


def median(res: dict, engine: str, *path: str) -> float | None:
    xs = figures(res, engine, list(path))
    return statistics.median(xs) if xs else None


def spread(res: dict, engine: str, *path: str, digits: int = 0) -> str:
    xs = figures(res, engine, list(path))
    if not xs:
        return "—"
    f = f"{{:,.{digits}f}}"
    m = f.format(statistics.median(xs))
    return m if len(xs) == 1 else f"{m} ({f.format(min(xs))}–{f.format(max(xs))})"


def verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("**met**" if ok else "**NOT met**")


def report(res: dict) -> None:
    p = res["params"]
    engines = [e for e in ENGINES if any(e in run for run in res["runs"])]
    k_map = median(res, "kestrel", "map", "tasks_per_s")
    d_map = median(res, "dask", "map", "tasks_per_s")
    lat_med = median(res, "kestrel", "latency", "median_us")
    lat_p99 = median(res, "kestrel", "latency", "p99_us")
    chain = median(res, "kestrel", "chain", "ms_per_link")
    py_cmd = median(res, "kestrel", "commands", "tasks_per_s")
    cli_cmd = median(res, "kestrel", "cli", "tasks_per_s")
    stream = res.get("stream") or {}
    rss = stream.get("client_peak_rss_kib")
    cmd_ratio = py_cmd / cli_cmd if py_cmd and cli_cmd else None
    # The largest of the runs: the bound is on every run.
    throughs = figures(res, "kestrel", ["value", "through_server_bytes"])
    through = max(throughs) if throughs else None
    d_throughs = figures(res, "dask", ["value", "server_socket_bytes"])
    d_through = max(d_throughs) if d_throughs else None
    others_all = figures(res, "kestrel", ["value", "on_other_workers"])
    others = int(min(others_all)) if others_all else 0
    consumers = p.get("value_workers", 5)
    goals = [
        (
            f"1. {p['tasks']:,} no-op calls through `client.map`: ≥ 20,000 tasks/s and ≥ 20× Dask",
            f"{k_map or 0:,.0f} tasks/s, {k_map / d_map:.1f}× Dask" if k_map and d_map else "—",
            None if not (k_map and d_map) else k_map >= 20_000 and k_map >= 20 * d_map,
        ),
        (
            f"2. {p['stream']:,} generator items through `client.map`: client RSS ≤ 300 MB",
            f"{rss / 1024:,.0f} MB, server {stream['server_hwm_kib'] / 1024:,.0f} MB"
            if rss and stream.get("server_hwm_kib")
            else stream.get("error", "—")[:80],
            None if not rss else rss <= 300 * 1024,
        ),
        (
            "3. `submit(noop).result()`: median ≤ 1 ms, p99 ≤ 5 ms",
            f"median {lat_med / 1e3:.3f} ms, p99 {lat_p99 / 1e3:.3f} ms"
            if lat_med and lat_p99
            else "—",
            None if not (lat_med and lat_p99) else lat_med <= 1000 and lat_p99 <= 5000,
        ),
        (
            f"4. a chain of {p['links']:,} dependent calls: ≤ 2 ms a link",
            f"{chain:.3f} ms a link" if chain else "—",
            None if chain is None else chain <= 2.0,
        ),
        (
            f"5. {p['commands']:,} `/bin/true` from Python: ≥ 90% of the CLI's rate",
            f"{cmd_ratio:.0%} ({py_cmd:,.0f} vs {cli_cmd:,.0f} tasks/s)" if cmd_ratio else "—",
            None if cmd_ratio is None else cmd_ratio >= 0.9,
        ),
        (
            (
                f"6. a {p.get('value_mb', 200)} MB result consumed by tasks on other workers: "
                "< 1 MB through the server"
            ),
            f"{through / 1024:,.1f} KB through the server ({others} of {consumers} consumers on "
            f"other workers); Dask's scheduler {d_through / 1024:,.1f} KB"
            if through is not None and d_through is not None
            else "—",
            None if through is None or not others else through < (1 << 20) and others >= 4,
        ),
    ]
    m = res["machine"]
    L: list[str] = []
    a = L.append
    a(f"# {TITLE}\n")
    a(
        f"Measured {m['date']} on {m['nproc']} cores ({m['cpu']}), {m['memory']}, Python "
        f"{m['python']}, load at start {' '.join(m['load_at_start'])}; {p['runs']} runs, "
        f"{p['slots']} slots per engine; medians, with the range over runs in brackets. "
        "Written by `bench/python_futures.py` (how each figure is measured is in its "
        "docstring).\n"
    )
    a("## Goals\n")
    a("| goal | measured | verdict |")
    a("|---|---|---|")
    for goal, got, ok in goals:
        a(f"| {goal} | {got} | {verdict(ok)} |")
    a("")
    a("## Side by side\n")
    versions = {
        e: next((run[e].get("version") for run in res["runs"] if run.get(e, {}).get("version")), "")
        for e in engines
    }
    a(
        "| engine | map: calls | map: tasks/s | submit→result median µs | p99 µs | "
        "chain ms/link | client peak RSS MB |"
    )
    a("|---|---|---|---|---|---|---|")
    for e in engines:
        calls = p["tasks"] if e == "kestrel" else p["peer_tasks"]
        rss_mb = median(res, e, "client_peak_rss_kib")
        a(
            f"| {e} {versions[e]} | {calls:,} | {spread(res, e, 'map', 'tasks_per_s')} | "
            f"{spread(res, e, 'latency', 'median_us')} | {spread(res, e, 'latency', 'p99_us')} | "
            f"{spread(res, e, 'chain', 'ms_per_link', digits=3)} | "
            f"{rss_mb / 1024:,.0f} |"
            if rss_mb
            else f"| {e} | {calls:,} | — | — | — | — | — |"
        )
    for e in engines:
        for i, run in enumerate(res["runs"]):
            if "error" in run.get(e, {}):
                a(f"\n{e} failed in run {i + 1}: `{run[e]['error'].strip().splitlines()[-1]}`")
    a("")
    k_lat, d_lat = lat_med, median(res, "dask", "latency", "median_us")
    r_lat, r_map = (
        median(res, "ray", "latency", "median_us"),
        median(res, "ray", "map", "tasks_per_s"),
    )
    ratios = []
    if k_map and d_map:
        ratios.append(f"map {k_map / d_map:.0f}× Dask's rate")
    if k_map and r_map:
        ratios.append(f"{k_map / r_map:.0f}× Ray's")
    if k_lat and d_lat:
        ratios.append(f"a round trip {d_lat / k_lat:.0f}× quicker than Dask's")
    if k_lat and r_lat:
        ratios.append(f"{r_lat / k_lat:.1f}× quicker than Ray's")
    if ratios:
        a("Kestrel against the peers, medians of the same runs: " + "; ".join(ratios) + ".\n")
    if py_cmd:
        a("## `/bin/true` from Python, from the CLI, and from `xargs`\n")
        a("| | tasks | tasks/s |")
        a("|---|---|---|")
        a(
            f"| `client.map_commands` | {p['commands']:,} | {spread(res, 'kestrel', 'commands', 'tasks_per_s')} |"
        )
        a(
            f"| `kestrel submit --array --wait` | {p['commands']:,} | {spread(res, 'kestrel', 'cli', 'tasks_per_s')} |"
        )
        a(
            f"| `xargs -P 2` (the machine) | {p['commands']:,} | {spread(res, 'xargs', 'tasks_per_s')} |"
        )
        a("")
    if through is not None:
        a(f"## A {p.get('value_mb', 200)} MB result read by {consumers} calls\n")
        a(
            "One call returns the value; then as many calls as workers each take its future, "
            "one on the worker holding it and the others on the other workers, and digest it. "
            "Seconds from the producer's end to the last consumer's; bytes through the server "
            "as it counts them, and as the kernel counts them on its TCP connections (`ss`); "
            "the largest over the runs for bytes.\n"
        )
        a(
            "| engine | consumers on other workers | seconds | through the server (own count) | server's sockets |"
        )
        a("|---|---|---|---|---|")
        for e in ("kestrel", "dask"):
            socks = figures(res, e, ["value", "server_socket_bytes"])
            own = figures(res, e, ["value", "through_server_bytes"])
            on = figures(res, e, ["value", "on_other_workers"])
            if not socks:
                continue
            a(
                f"| {e} | {int(min(on))} of {consumers} | "
                f"{spread(res, e, 'value', 'consume_s', digits=2)} | "
                + (f"{max(own) / 1024:,.1f} KB" if own else "—")
                + f" | {max(socks) / 1024:,.1f} KB |"
            )
        a("")
    if stream and "error" not in stream:
        a("## A generator of ten million items\n")
        if stream.get("measured"):
            a(f"Measured again on its own, {stream['measured']}.\n")
        a(
            f"{stream['tasks']:,} items in {stream['seconds']:,.0f} s "
            f"({stream['tasks_per_s']:,.0f} tasks/s). Client peak RSS "
            f"{stream['client_peak_rss_kib'] / 1024:,.0f} MB (before the map "
            f"{stream['client_rss_kib_before'] / 1024:,.0f} MB); server peak "
            f"{stream['server_hwm_kib'] / 1024:,.0f} MB; worker peak "
            f"{(stream.get('worker_hwm_kib') or 0) / 1024:,.0f} MB"
            + (
                f"; its largest Python runner's peak {stream['runner_hwm_kib'] / 1024:,.0f} MB"
                if stream.get("runner_hwm_kib")
                else ""
            )
            + ".\n"
        )
    elif stream:
        a(f"The ten-million-item stream failed: `{stream['error'].strip().splitlines()[-1]}`\n")
    PART_DOC.write_text("\n".join(L).rstrip() + "\n")
    log(f"wrote {PART_DOC.relative_to(REPO)}")
    splice_section(DOC, PART_DOC, TITLE, "bench/python_futures.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--peer-tasks", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--links", type=int, default=1000)
    ap.add_argument("--commands", type=int, default=100_000)
    ap.add_argument("--stream", type=int, default=10_000_000)
    ap.add_argument("--value-mb", type=int, default=200)
    ap.add_argument("--value-workers", type=int, default=5)
    ap.add_argument("--only", default=",".join(ENGINES))
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument(
        "--kestrel-python", type=Path, help="a Python with the package installed (no venv made)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "python.json")
    ap.add_argument("--report", type=Path, help="rewrite the doc from this result file only")
    ap.add_argument(
        "--redo-stream",
        action="store_true",
        help="measure only the stream again, into the results already in --out",
    )
    ap.add_argument(
        "--redo-value",
        action="store_true",
        help="measure only the value workload again (--runs times), into the results in --out",
    )
    a = ap.parse_args()
    if a.report:
        report(json.loads(a.report.read_text()))
        return 0
    if a.redo_value:
        res = json.loads(a.out.read_text())
        kpy = (a.kestrel_python and a.kestrel_python.absolute()) or kestrel_python(not a.no_build)
        only = [e for e in a.only.split(",") if e]
        ppy = peers_python() if "dask" in only else None
        for r, run in enumerate(res["runs"][: a.runs]):
            measure_value(a, run, r, kpy, ppy, only)
        res["params"] |= {"value_mb": a.value_mb, "value_workers": a.value_workers}
    elif a.redo_stream:
        res = json.loads(a.out.read_text())
        py = (a.kestrel_python and a.kestrel_python.absolute()) or kestrel_python(not a.no_build)
        log(f"stream: {a.stream:,} generator items through client.map")
        res["stream"] = child(py, "kestrel", "stream", a, timeout=7200)["stream"]
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            check=False,
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        res["stream"]["measured"] = f"{machine()['date']}, at commit {commit}"
    else:
        res = measure(a)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    log(f"wrote {a.out}")
    report(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
