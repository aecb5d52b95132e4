#!/usr/bin/env python3
"""A/B: this build of Kestrel against a baseline revision on the suite's own workloads, in one
run, samples interleaved (A B, then B A, ...) so that a drifting machine load hits both alike.

    python3 bench/ab.py --baseline b514fcd [--runs 3] [--quick] [--no-build]

The baseline is built from a git worktree of REV into bench/results/ab-<REV>/ (git-ignored).
Each figure is the median of --runs samples per side; "change" is the current build against the
baseline, signed so that positive is better. Writes docs/benchmarks-ab.md and the raw samples
to bench/results/ab-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from kbench.common import FULL, QUICK, REPO, RESULTS, SLOTS, log
from kbench.machine import build, kestrel_copy, machine
from kbench.procs import PROCS
from kbench.suite import Suite

DOC = REPO / "docs" / "benchmarks-ab.md"
# Worse than the baseline by more than this fails the comparison (issue 10: "within 5%").
TOLERANCE = 0.05


def measurements(cfg: dict, each_file: Path) -> list[tuple[str, str, bool, object]]:
    """(name, key, higher_is_better, fn(suite) -> sample) of every compared figure."""
    n_true, n_noop, n_scale = cfg["true_tasks"], cfg["noop_counts"][-1], cfg["scale_tasks"]
    workers = cfg["scale_workers"]
    return [
        (f"`run`: {n_true:,} /bin/true", "rate", True, lambda s: s.k_run(n_true)),
        (
            f"server + worker: {n_true:,} /bin/true",
            "rate",
            True,
            lambda s: s.k_standalone(n_true, ["/bin/true"]),
        ),
        (
            f"server + worker, no journal: {n_true:,} /bin/true",
            "rate",
            True,
            lambda s: s.k_standalone(n_true, ["/bin/true"], journal=False),
        ),
        (
            f"noop {n_noop:,}: 2 workers x 1024 slots",
            "rate",
            True,
            lambda s: s.k_noop(n_noop, 2, 1024),
        ),
        (
            f"noop {n_noop:,}: 2 workers, no journal",
            "rate",
            True,
            lambda s: s.k_noop(n_noop, 2, 1024, journal=False),
        ),
        (
            f"server + worker, TLS: {n_true:,} /bin/true",
            "rate",
            True,
            lambda s: s.k_standalone(n_true, ["/bin/true"], tls=True),
        ),
        (
            f"noop {n_noop:,}: 2 workers x 1024 slots, TLS",
            "rate",
            True,
            lambda s: s.k_noop(n_noop, 2, 1024, tls=True),
        ),
        (
            f"noop {n_scale:,}: {workers} workers x 256 slots",
            "rate",
            True,
            lambda s: s.k_noop(n_scale, workers, 256, name="scale"),
        ),
        (
            f"efficiency: {cfg['efficiency'][1][1]} x sleep 0.1 on {SLOTS} slots (wall s)",
            "seconds",
            False,
            lambda s: s.k_standalone(cfg["efficiency"][1][1], ["sleep", "0.1"], name="eff"),
        ),
        (
            f"memory: queued {cfg['mem_array']:,}-task array (VmHWM KiB)",
            "hwm_kib",
            False,
            lambda s: s.mem_one("array", cfg["mem_array"], None),
        ),
        (
            f"memory: {cfg['mem_each']:,} distinct command lines (VmHWM KiB)",
            "hwm_kib",
            False,
            lambda s: s.mem_one("each", cfg["mem_each"], each_file),
        ),
        (
            f"restart with {cfg['restart_tasks']:,} finished + queued: to dispatching (s)",
            "dispatch_s",
            False,
            lambda s: s.restart_one(cfg["restart_tasks"], 1024),
        ),
    ]


def baseline_binary(rev: str, no_build: bool) -> Path:
    """Builds REV in a worktree of its own (kept for the next run) and returns its binary."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    tree = RESULTS / f"ab-{commit}"
    binary = tree / "target" / "release" / "kestrel"
    if no_build and binary.exists():
        return binary
    if not tree.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO, check=True
        )
    log(f"building the baseline {commit} in {tree} (cargo build --release)")
    subprocess.run(["cargo", "build", "--release"], cwd=tree, check=True)
    return binary


def median(samples: list[dict], key: str) -> float | None:
    vals = [s[key] for s in samples if "error" not in s and s.get(key) is not None]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the git revision to compare against")
    ap.add_argument("--runs", type=int, default=3, help="samples per side of each figure")
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke test")
    ap.add_argument("--no-build", action="store_true", help="use the binaries as they are")
    ap.add_argument("--only", default="", help="comma-separated words: figures whose name has one")
    ap.add_argument("--idle-wait", type=float, default=600)
    args = ap.parse_args()
    args.no_peers, args.quick_peers = True, False
    cfg = dict(QUICK if args.quick else FULL, runs=args.runs)
    if not args.no_build:
        build(2)
    base_bin = baseline_binary(args.baseline, args.no_build)
    RESULTS.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="kestrel-ab-"))
    try:
        cur_bin, cur_info = kestrel_copy(root)
        base_copy = root / "kestrel-baseline"
        shutil.copy2(base_bin, base_copy)
        sides = {
            "baseline": Suite(args, cfg, str(base_copy), root),
            "current": Suite(args, cfg, cur_bin, root),
        }
        each_file = root / "each-lines.txt"
        with open(each_file, "w") as f:
            f.writelines(f"input-{i:06d}.dat\n" for i in range(1, cfg["mem_each"] + 1))
        words = [w for w in args.only.split(",") if w]
        rows = []
        for name, key, higher, fn in measurements(cfg, each_file):
            if words and not any(w in name for w in words):
                continue
            samples: dict[str, list[dict]] = {"baseline": [], "current": []}
            for r in range(args.runs):
                order = ["baseline", "current"] if r % 2 == 0 else ["current", "baseline"]
                for side in order:
                    log(f"{name}: {side} run {r + 1}/{args.runs}")
                    s = sides[side].attempt(name, fn, sides[side])
                    log(f"  {key} = {s.get(key, s.get('error'))}")
                    samples[side].append(s)
            a, b = median(samples["baseline"], key), median(samples["current"], key)
            change = None
            if a and b:
                change = (b / a - 1) if higher else (a / b - 1)
            rows.append(
                {
                    "name": name,
                    "key": key,
                    "higher_is_better": higher,
                    "baseline": a,
                    "current": b,
                    "change": change,
                    "samples": samples,
                }
            )
    finally:
        PROCS.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    raw = {"machine": machine(), "current": cur_info, "baseline": args.baseline, "rows": rows}
    (RESULTS / f"ab-{stamp}.json").write_text(json.dumps(raw, indent=1))
    write_doc(raw, args, cfg)


def write_doc(raw: dict, args, cfg: dict) -> None:
    def fmt(v: float | None, key: str) -> str:
        if v is None:
            return "-"
        if key == "rate":
            return f"{v:,.0f}/s"
        if key == "hwm_kib":
            return f"{v / 1024:,.1f} MiB"
        return f"{v:.2f} s"

    m, cur = raw["machine"], raw["current"]
    lines = [
        "# A/B against the baseline",
        "",
        (
            f"`python3 bench/ab.py --baseline {raw['baseline']} --runs {args.runs}"
            f"{' --quick' if args.quick else ''}{f' --only {args.only}' if args.only else ''}`"
            f" on {m['date']}: the current build "
            f"({cur['commit']}{', with uncommitted changes' if cur['dirty'] else ''}) and "
            f"{raw['baseline']} on the same workloads of the benchmark suite, in one run, "
            "samples interleaved (A B, then B A). Medians of the samples of each side; a change "
            f"is signed so that positive is better; worse by more than {TOLERANCE:.0%} fails."
        ),
        "",
        (
            f"Machine: {m['cpu']}, {m['nproc']} cores, {m['memory']}; load at start "
            f"{' '.join(m['load_at_start'])}."
        ),
        "",
        "| figure | baseline | current | change | |",
        "|---|---|---|---|---|",
    ]
    for r in raw["rows"]:
        ch = r["change"]
        verdict = "-" if ch is None else ("pass" if ch >= -TOLERANCE else "**worse**")
        lines.append(
            f"| {r['name']} | {fmt(r['baseline'], r['key'])} | {fmt(r['current'], r['key'])} | "
            f"{'-' if ch is None else f'{ch:+.1%}'} | {verdict} |"
        )
    # What encryption costs, within the current build: each `, TLS` figure against the same
    # figure in plain TCP, both measured in this run.
    by_name = {r["name"]: r for r in raw["rows"]}
    tls_rows = [
        (r, by_name.get(r["name"].removesuffix(", TLS").replace(", TLS:", ":")))
        for r in raw["rows"]
        if "TLS" in r["name"]
    ]
    tls_rows = [(t, p) for t, p in tls_rows if p and t["current"] and p["current"]]
    if tls_rows:
        lines += [
            "",
            "What TLS costs in the current build (`--tls` against plain TCP, same run):",
            "",
        ]
        for t, p in tls_rows:
            lines.append(
                f"- {p['name']}: {fmt(p['current'], p['key'])} plain, "
                f"{fmt(t['current'], t['key'])} with TLS ({t['current'] / p['current'] - 1:+.1%})"
            )
    lines += [
        "",
        "Samples per side (in the order taken):",
        "",
    ]
    for r in raw["rows"]:
        for side in ("baseline", "current"):
            vals = [
                fmt(s.get(r["key"]), r["key"]) if "error" not in s else "error"
                for s in r["samples"][side]
            ]
            lines.append(f"- {r['name']}, {side}: {', '.join(vals)}")
    DOC.write_text("\n".join(lines) + "\n")
    log(f"wrote {DOC}")


if __name__ == "__main__":
    main()
