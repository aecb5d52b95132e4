#!/usr/bin/env python3
"""Kestrel's benchmark suite (issue 3): Kestrel side by side with xargs, HyperQueue, Dask, Parsl.

One command builds the release binary, runs every scenario, the peers in the same invocation,
and writes the report:

    python3 bench/run.py [--quick] [--runs 3] [--only NAME,...] [--no-peers]

    --quick        small counts, 1 run, no peers: a smoke test of the script; writes
                   bench/results/quick.md instead of docs/benchmarks.md. About 4 minutes on
                   this 2-core machine once the release build is done (the chaos scenario's
                   release test build and run are 2 of them); on a busy one it first waits up to
                   5 minutes in all (--idle-wait) for other processes to quiet down, and a target
                   missed while they used the CPU says n/a, not FAIL
    --idle-wait S  seconds in all to wait, before samples, for other processes to stop using
                   the CPU (default 1200, with --quick 300); the log says which samples ran on
                   a busy machine anyway
    --runs N       measure each figure N times (default 3) and report median, min and max
    --only A,B     run only these scenarios: true, noop, efficiency, memory, workers, journal,
                   chaos, output
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
  output      100,000 `echo {task}` tasks on `kestrel run --workers 1 --slots 2` with stdout
              streamed to the server (`--stdout stream`, printed by `run` in task order) and in
              one file per task; and on a standalone server (journal on and off): its memory,
              journal size per task, and the time of `kestrel job cat`

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
import datetime as dt
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from kbench.common import DOC, FULL, QUICK, REPO, RESULTS, SCENARIOS, T0, log
from kbench.machine import build, kestrel_copy, machine
from kbench.plots import ensure_matplotlib
from kbench.procs import PROCS
from kbench.report import loaded_scenarios, report, targets, verdict
from kbench.suite import Suite

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
        help="seconds in all to wait for other CPU users to finish (default 1200, --quick 300)",
    )
    ap.add_argument("--build-retries", type=int, default=5)
    ap.add_argument("--doc", type=Path, help="report path (default: see above)")
    ap.add_argument("--report", type=Path, help="rewrite the report from this raw results file")
    args = ap.parse_args()
    if args.idle_wait is None:
        args.idle_wait = 300 if args.quick else 1200
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
        res["scenario_s"] = {}
        for name in SCENARIOS:
            if name in only:
                t = time.monotonic()
                try:
                    getattr(suite, f"scenario_{name}")()
                except Exception as e:  # noqa: BLE001 - the other scenarios still run
                    log(f"scenario {name} FAILED: {e}")
                    res["setup_errors"].append(f"scenario {name}: {e}")
                res["scenarios"] = suite.res
                res["scenario_s"][name] = round(time.monotonic() - t, 1)
                log(f"scenario {name} took {res['scenario_s'][name]:.0f} s")
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
    busy = loaded_scenarios(res)
    if busy:
        log(
            f"the machine was busy with other processes during {', '.join(sorted(busy))}: "
            "targets missed there are n/a, not FAIL; run again on a quiet machine to judge them"
        )
    log(f"done in {(time.monotonic() - T0) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
