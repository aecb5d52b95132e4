#!/usr/bin/env python3
"""The seeds' experiments in `kestrel sim` (issue 32): Falkon's MI table and SC08's million
tasks on 160K cores, each run from the workload as the seed describes it, beside the seed's
figure.

    python3 bench/simulation.py [--no-build] [--seeds 1,2,3] [--out bench/results/simulation.json]
                                [--real bench/results/diffusion-arrival.json] [--only SCENARIO,...]
    python3 bench/simulation.py --report bench/results/simulation.json   # only rewrite the doc

Runs `kestrel sim --output json` on examples/sim/falkon-mi.toml, sc08-1m.toml, diffusion-mi.toml
and sc08-efficiency.toml once per seed; writes the raw results,
docs/simulation-figures.md (the tables, with each run's error against the seed, the validation
against the real engine, and the simulator's speed) and docs/simulation.png (with matplotlib:
the benchmark venv's, see bench/run.py, when this Python has none). The validation compares
diffusion-mi.toml with what `bench/diffusion.py --only arrival` measured with real workers
and the slow store (`--real`: its raw results). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kbench.common import REPO, RESULTS, log
from kbench.plots import plot_elsewhere

KESTREL = REPO / "target" / "release" / "kestrel"
FIGURES = REPO / "docs" / "simulation-figures.md"
PNG = REPO / "docs" / "simulation.png"

# The seeds' figures, to compare with (never model inputs).
MI_SEED = {
    "fa": 5011,
    "gcc-1g": 3762,
    "gcc-1.5g": 1596,
    "gcc-2g": 1436,
    "gcc-4g": 1427,
    "mch-4g": 2888,
    "mcu-4g": 2037,
}
MI_SEED_HITS = {
    "fa": 0.0,
    "gcc-1g": 0.31,
    "gcc-1.5g": 0.79,
    "gcc-2g": 0.98,
    "gcc-4g": 0.94,
    "mch-4g": 0.95,
}
SC08_SEED = {"sc08-1m": 368}
SCENARIOS = [
    "examples/sim/falkon-mi.toml",
    "examples/sim/sc08-1m.toml",
    "examples/sim/diffusion-mi.toml",
    "examples/sim/sc08-efficiency.toml",
]
# SC08's efficiency figures, where the paper gives one (Figs. 5-6 and their text).
SC08_EFFICIENCY = {
    "one-256-4s": "95%+",
    "one-2048-4s": "95%+",
    "many-163840-4s": "7%",
    "many-163840-64s": "90%+ needs at least 64 s",
}
# diffusion-mi.toml's runs, by bench/diffusion.py's labels.
REAL_LABELS = {
    "fa-no-cache": "first-available, no caches",
    "fa": "first-available",
    "mch": "max-cache-hit",
    "mcu": "max-compute-util",
    "gcc": "good-cache-compute",
}


def simulate(scenario: str, seed: int) -> tuple[dict, float]:
    cmd = [str(KESTREL), "sim", "--output", "json", "--seed", str(seed), str(REPO / scenario)]
    start = time.monotonic()
    out = subprocess.run(cmd, check=False, capture_output=True, text=True)
    wall = time.monotonic() - start
    if out.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed: {out.stderr}")
    return json.loads(out.stdout), wall


def measure(seeds: list[int], only: list[str], res: dict) -> dict:
    """Runs the scenarios (those of `only`, if given, into the results `res` holds already)."""
    res = dict(res) if only else {}
    res["seeds"] = seeds
    res.setdefault("scenarios", {})
    for scenario in only or SCENARIOS:
        runs: dict = {}
        walls = []
        for seed in seeds:
            log(f"{scenario}, seed {seed}")
            doc, wall = simulate(scenario, seed)
            walls.append(wall)
            for r in doc["runs"]:
                runs.setdefault(r["name"], []).append(r)
        res["scenarios"][scenario] = {"runs": runs, "wall_s": walls}
    return res


def err(sim: float, seed: float) -> str:
    return f"{(sim - seed) / seed * 100:+.0f}%"


def report(res: dict) -> str:
    mi = res["scenarios"]["examples/sim/falkon-mi.toml"]["runs"]
    sc = res["scenarios"]["examples/sim/sc08-1m.toml"]["runs"]
    n = len(res["seeds"])
    lines = [
        "<!-- written by bench/simulation.py; do not edit by hand -->",
        "",
        f"Medians of {n} seed(s) ({', '.join(map(str, res['seeds']))}).",
        "",
        "### Falkon's MI workload (`examples/sim/falkon-mi.toml`)",
        "",
        (
            "| run | seed's makespan | simulated | error | seed's hits | simulated hits "
            "(local/peer) | store read | cpu busy | sim wall time |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, seed_s in MI_SEED.items():
        rs = mi[name]
        mk = statistics.median(r["makespan_s"] for r in rs)
        local = statistics.median(r["data"]["local_hits"] for r in rs)
        peer = statistics.median(r["data"]["peer_hits"] for r in rs)
        store = statistics.median(r["data"]["store_reads"] for r in rs)
        inputs = local + peer + store
        hits = f"{(local + peer) / inputs:.0%} ({local / inputs:.0%}/{peer / inputs:.0%})"
        lines.append(
            f"| {name} | {seed_s:,} s | {mk:,.0f} s | {err(mk, seed_s)} | "
            f"{f'{MI_SEED_HITS[name]:.0%}' if name in MI_SEED_HITS else 'not given'} | {hits} | "
            f"{statistics.median(r['data']['store_bytes'] for r in rs) / 1e9:,.0f} GB | "
            f"{statistics.median(r['cpu_utilisation'] for r in rs):.0%} | "
            f"{statistics.median(r['wall_s'] for r in rs):.1f} s |"
        )
    order_seed = sorted(MI_SEED, key=MI_SEED.get)
    order_sim = sorted(MI_SEED, key=lambda k: statistics.median(r["makespan_s"] for r in mi[k]))
    lines += [
        "",
        f"Ordering, fastest first: seed {', '.join(order_seed)}; simulated {', '.join(order_sim)}.",
        "",
        "### SC08: a million tasks on 163,840 cores (`examples/sim/sc08-1m.toml`)",
        "",
        "| run | seed's makespan | simulated | error | events | sim wall time | events/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, seed_s in SC08_SEED.items():
        rs = sc[name]
        mk = statistics.median(r["makespan_s"] for r in rs)
        lines.append(
            f"| {name} | {seed_s} s | {mk:,.0f} s | {err(mk, seed_s)} | "
            f"{statistics.median(r['events'] for r in rs):,.0f} | "
            f"{statistics.median(r['wall_s'] for r in rs):.2f} s | "
            f"{statistics.median(r['events_per_s'] for r in rs):,.0f} |"
        )
    lines += efficiency(res)
    lines += validation(res)
    return "\n".join(lines) + "\n"


def efficiency(res: dict) -> list[str]:
    """SC08's efficiency against task length, beside the paper's figures."""
    runs = res["scenarios"].get("examples/sim/sc08-efficiency.toml", {}).get("runs", {})
    out = [
        "",
        "### SC08: efficiency against task length (`examples/sim/sc08-efficiency.toml`)",
        "",
        "`one-`: one dispatcher (1,758 tasks/s); `many-`: distributed dispatchers (3,071 tasks/s).",
        "",
        "| run | cores | task length | paper | simulated efficiency |",
        "|---|---|---|---|---|",
    ]
    for name, rs in runs.items():
        _, cores, length = name.split("-")
        eff = statistics.median(r["efficiency"] for r in rs)
        out.append(
            f"| {name} | {int(cores):,} | {length} | {SC08_EFFICIENCY.get(name, '')} | {eff:.0%} |"
        )
    return out


def validation(res: dict) -> list[str]:
    """diffusion-mi.toml beside bench/diffusion.py's real runs of the same workload."""
    sim = res["scenarios"]["examples/sim/diffusion-mi.toml"]["runs"]
    real = [r for r in res.get("real", []) if r.get("workload") == "uniform"]
    out = [
        "",
        "### Validation: simulated against real on this machine (`examples/sim/diffusion-mi.toml`)",
        "",
    ]
    if not real:
        return [*out, "No real runs given (`--real`): nothing to compare with."]
    out += [
        (
            f"Real: `bench/diffusion.py --only arrival`, uniform workload, {len(real) // 5} run(s), "
            f"medians; {res.get('real_source', '')}"
        ),
        "",
        (
            "| run | real makespan | simulated | error | real store reads | simulated | error "
            "| real peer hits | simulated |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in REAL_LABELS.items():
        rr = [r for r in real if r["label"] == label]
        if not rr or name not in sim:
            continue
        rt = statistics.median(r["seconds"] for r in rr)
        rs = statistics.median(r["store_reads"] for r in rr)
        rp = statistics.median(r["peer_hits"] for r in rr)
        st = statistics.median(r["makespan_s"] for r in sim[name])
        ss = statistics.median(r["data"]["store_reads"] for r in sim[name])
        sp = statistics.median(r["data"]["peer_hits"] for r in sim[name])
        out.append(
            f"| {name} | {rt:.2f} s | {st:.2f} s | {err(st, rt)} | {rs:,.0f} | {ss:,.0f} | "
            f"{err(ss, rs)} | {rp:,.0f} | {sp:,.0f} |"
        )
    return out


def plot(res: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mi = res["scenarios"]["examples/sim/falkon-mi.toml"]["runs"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    names = list(MI_SEED)
    xs = range(len(names))
    sim = [statistics.median(r["makespan_s"] for r in mi[k]) for k in names]
    ax1.bar([x - 0.2 for x in xs], [MI_SEED[k] for k in names], 0.4, label="dissertation")
    ax1.bar([x + 0.2 for x in xs], sim, 0.4, label="kestrel sim")
    ax1.set_xticks(list(xs), names)
    ax1.set_ylabel("makespan (s)")
    ax1.set_title("Falkon's MI workload: makespan")
    ax1.legend()
    for k in ["fa", "gcc-1g", "gcc-1.5g", "gcc-2g"]:
        tl = mi[k][0]["timeline"]
        ax2.plot(
            [s["t_s"] for s in tl],
            [s["staged_bytes_per_s"] * 8 / 1e9 for s in tl],
            label=k,
        )
    ax2.set_xlabel("simulated time (s)")
    ax2.set_ylabel("inputs staged (Gbit/s)")
    ax2.set_title("MI: data throughput over time")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--out", type=Path, default=RESULTS / "simulation.json")
    ap.add_argument("--report", type=Path, help="only rewrite the doc from these results")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated scenario paths to run again, the others kept from --out",
    )
    ap.add_argument(
        "--real",
        type=Path,
        default=RESULTS / "diffusion-arrival.json",
        help="bench/diffusion.py's raw results to validate against",
    )
    ap.add_argument("--plot-only", nargs=2, type=Path, metavar=("RES", "PNG"))
    a = ap.parse_args()
    if a.plot_only:
        plot(json.loads(a.plot_only[0].read_text()), a.plot_only[1])
        return
    if a.report:
        res = json.loads(a.report.read_text())
    else:
        if not a.no_build:
            subprocess.run(
                ["cargo", "build", "--release", "-p", "kestrel-cli"], cwd=REPO, check=True
            )
        only = [o for o in a.only.split(",") if o]
        before = json.loads(a.out.read_text()) if only and a.out.exists() else {}
        res = measure([int(s) for s in a.seeds.split(",")], only, before)
        if a.real.exists() and "real" not in res:
            res["real"] = json.loads(a.real.read_text()).get("arrival", [])
            res["real_source"] = f"`{a.real.relative_to(REPO)}`"
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res))
    FIGURES.write_text(report(res))
    log(f"wrote {FIGURES.relative_to(REPO)}")
    try:
        import matplotlib  # noqa: F401

        plot(res, PNG)
    except ImportError:
        plot_elsewhere(Path(__file__), res, PNG)


if __name__ == "__main__":
    main()
