"""The report: the targets' verdicts and the Markdown page (docs/benchmarks.md)."""

from __future__ import annotations

import statistics
from pathlib import Path

from kbench.common import REPO, log
from kbench.plots import chaos_plot, plot
from kbench.procs import Quiet
from kbench.stats import med


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
    """Each target: what it asks, what was measured, and whether it was met (`None`: not
    judged, for want of a figure or because others used the machine while it was measured)."""
    sc = res["scenarios"]
    rows: list[tuple[str, str, bool | None]] = []
    busy = loaded_scenarios(res)

    def add(scenario: str, row: tuple[str, str, bool | None]) -> None:
        name, val, ok = row
        if ok is False and scenario in busy:
            # A miss on a busy machine measures the others' load, not Kestrel.
            val, ok = f"{val}; not judged: other processes used the CPU meanwhile", None
        rows.append((name, val, ok))

    t = sc.get("true")
    if t:
        x = med(t.get("xargs"))
        hq = med(t["peers"].get("hyperqueue/true"))
        for key, label in [("kestrel_run", "`kestrel run`"), ("kestrel_submit", "server + worker")]:
            k = med(t[key])
            rx, rh = ratio(k, x), ratio(k, hq)
            add(
                "true",
                (
                    f"/bin/true, {label}: ≥ 90% of xargs -P 2",
                    f"{rx:.0%} ({fmt_rate(k)} vs {fmt_rate(x)} tasks/s)" if rx else "—",
                    None if rx is None else rx >= 0.9,
                ),
            )
            add(
                "true",
                (
                    f"/bin/true, {label}: ≥ 2× HyperQueue",
                    f"{rh:.1f}× ({fmt_rate(k)} vs {fmt_rate(hq)} tasks/s)" if rh else "—",
                    None if rh is None else rh >= 2,
                ),
            )
    n = sc.get("noop")
    if n:
        big = max(n["counts"], key=int)
        k = med(n["counts"][big])
        add(
            "noop",
            (
                f"noop, {int(big):,} tasks end to end: ≥ 100,000 tasks/s",
                f"{fmt_rate(k)} tasks/s",
                None if k is None else k >= 100_000,
            ),
        )
    e = sc.get("efficiency")
    if e:
        for row in e["rows"]:
            if abs(row["length_s"] - 0.1) < 1e-9:
                v = (row.get("efficiency") or {}).get("median")
                add(
                    "efficiency",
                    (
                        "efficiency of 100 ms tasks: ≥ 95%",
                        "—" if v is None else f"{v:.1%}",
                        None if v is None else v >= 0.95,
                    ),
                )
    m = sc.get("memory")
    if m:
        a = (m["array"].get("hwm_kib") or {}).get("median")
        add(
            "memory",
            (
                f"server memory, {m['array']['tasks']:,}-task array, no workers: ≤ 200 MiB",
                f"VmHWM {mib(a)} MiB",
                None if a is None else a <= 200 * 1024,
            ),
        )
        b = (m["each"].get("hwm_kib") or {}).get("median")
        add(
            "memory",
            (
                f"server memory, {m['each']['tasks']:,} distinct command lines: ≤ 1 GiB",
                f"VmHWM {mib(b)} MiB",
                None if b is None else b <= 1024 * 1024,
            ),
        )
    w = sc.get("workers")
    if w:
        k, ref = med(w), w.get("ref_rate")
        r = ratio(k, ref)
        label = f"{w['workers']} workers, {w['tasks']:,} noop tasks: ≥ 80% of the 2-worker rate"
        add(
            "workers",
            (
                label,
                f"{r:.0%} ({fmt_rate(k)} vs {fmt_rate(ref)} tasks/s)"
                if r
                else f"{fmt_rate(k)} tasks/s",
                None if r is None else r >= 0.8,
            ),
        )
    j = sc.get("journal")
    if j:
        for kind, n, want in [("noop", j["noop_tasks"], 0.5), ("true", j["true_tasks"], 0.9)]:
            on, off = med(j.get(f"{kind}_on")), med(j.get(f"{kind}_off"))
            r = ratio(on, off)
            what = "noop" if kind == "noop" else "/bin/true"
            add(
                "journal",
                (
                    f"journal on, {n:,} {what} tasks: ≥ {want:.0%} of the in-memory rate",
                    f"{r:.0%} ({fmt_rate(on)} vs {fmt_rate(off)} tasks/s)" if r else "—",
                    None if r is None else r >= want,
                ),
            )
        rs = (j.get("restart") or {}).get("dispatch_s") or {}
        v = rs.get("median")
        nr = j["restart"]["tasks"]
        add(
            "journal",
            (
                f"restart with {nr:,} finished + {nr:,} queued tasks: dispatching ≤ 10 s",
                "—" if v is None else f"{v:.2f} s",
                None if v is None else v <= 10,
            ),
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
        "\npython3 bench/run.py --quick      # smoke test: small counts, 1 run, no peers (~4 min)"
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
    loud = [s for s in samples if Quiet.loaded(s)]
    a(
        f" Before each sample the suite waits (up to 3 min) until other processes use less "
        f"than {Quiet.THRESHOLD} cores; in this run it waited {waited / 60:.1f} min in all, and "
        f"{len(loud)} of {len(samples)} samples had others use more when they started or while "
        "they ran (the machine's busy time less the suite's own). A target missed in a scenario "
        "with such a sample is not judged: it says `n/a`, not FAIL."
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
            f"`--slots` for its 2 workers, a one-run sweep picks the {w['workers']} workers' "
            "`--slots` "
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

    o = sc.get("output")
    if o:
        _output_section(a, o)

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
    _ab_section(a, doc.with_name("benchmarks-ab.md"))
    _copied_section(
        a,
        doc.with_name("benchmarks-diffusion.md"),
        "Data diffusion on a slow shared store (issue 12)",
        "bench/diffusion.py",
    )
    for part, title, writer in (
        (
            "benchmarks-graphs.md",
            "Montage: intermediate data off the store (issue 13)",
            "bench/graphs.py",
        ),
        (
            "benchmarks-graphs-w.md",
            "W1 and W2: a file between workers (issue 13)",
            "bench/graphs_w.py",
        ),
        (
            "benchmarks-graphs-lineage.md",
            "Lineage: a worker killed mid-run (issue 13)",
            "bench/graphs_lineage.py",
        ),
        (
            "benchmarks-provisioning.md",
            "Workers from the batch system: Falkon's 18 stages on Slurm (issue 14)",
            "bench/provisioning.py",
        ),
        (
            "benchmarks-python.md",
            "Python: futures, map and commands against Dask, Ray and Parsl (issue 31)",
            "bench/python_futures.py",
        ),
    ):
        _copied_section(a, doc.with_name(part), title, writer)
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
        "- **Streamed output**: `kestrel run --workers 1 --slots 2 --array 1-N --stdout stream "
        "--stderr none --quiet -- echo {task}` (the outputs printed by `run`, checked in task "
        "order) against the same with `--stdout job-{job}/{task}.out` (the files counted), timed "
        "whole; then one standalone server + worker per mode, journal on and off, for the "
        "server's VmRSS, the journal's size and the time of `kestrel job cat`."
    )
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


def _ab_section(a, ab: Path) -> None:
    """The last A/B against an earlier build (`bench/ab.py` writes it), so that this report,
    rewritten by every suite run, keeps it."""
    _copied_section(a, ab, "A/B against an earlier build (`bench/ab.py`)", "bench/ab.py")


def _copied_section(a, part: Path, title: str, writer: str) -> None:
    """A report another script writes (`part`), copied in under `title`, so that this report,
    rewritten by every suite run, keeps it."""
    if not part.exists():
        return
    body = part.read_text().split("\n", 1)[-1].strip()
    a(f"## {title}\n")
    a(f"Copied from [{part.name}]({part.name}), which `{writer}` writes.\n")
    # Its headings sit one level under this section's.
    a("\n".join("#" + line if line.startswith("#") else line for line in body.split("\n")) + "\n")


def splice_section(doc: Path, part: Path, title: str, writer: str) -> None:
    """Copies `part` into `doc` under `title` as this report does (`_copied_section`),
    replacing the section there or adding it before "How each figure was measured": for a
    script that writes its own part without rerunning the whole suite."""
    lines: list[str] = []
    _copied_section(lines.append, part, title, writer)
    section = "\n".join(lines).rstrip() + "\n\n"
    text = doc.read_text()
    head = f"## {title}\n"
    if head in text:
        start = text.index(head)
        nxt = text.find("\n## ", start + len(head))
        text = text[:start] + section + (text[nxt + 1 :] if nxt >= 0 else "")
    else:
        at = text.find("## How each figure was measured")
        at = at if at >= 0 else len(text)
        text = text[:at] + section + text[at:]
    doc.write_text(text)
    log(f"updated {doc.relative_to(REPO)}")


def _output_section(a, o: dict) -> None:
    n = o["tasks"]
    # Wall time per task: the median run's seconds over its tasks.
    per = {m: _per_task_us(o.get(f"run_{m}"), n) for m in ("stream", "files")}
    a(f"## 6. Streamed output against one file per task ({n:,} tasks, {o['slots']} slots)\n")
    if per["stream"] and per["files"]:
        a(
            f"**Streamed output: {per['stream']:,.0f} µs/task vs files {per['files']:,.0f} "
            f"µs/task** (`kestrel run --workers 1 --slots 2`, {n:,} × `echo {{task}}`, wall "
            "time per task, median). With `--stdout stream` each task's stdout goes through a "
            "pipe to its worker, travels with the task's end to the server and is kept in the "
            "job's log; `run` prints the log in task order at the end (included in the time). "
            "With files, each task creates `job-1/<task>.out`: "
            f"{n:,} files in one directory.\n"
        )
    a("| stdout | median s | median tasks/s | min – max tasks/s | runs | µs/task (median) |")
    a("|---|---|---|---|---|---|")
    for m, label in [("stream", "`--stdout stream`"), ("files", "`job-{job}/{task}.out`")]:
        fig = o.get(f"run_{m}")
        us = per[m]
        a(f"| {label} | {' | '.join(rate_cells(fig))} | {'—' if us is None else f'{us:,.0f}'} |")
    a("")
    srv = o.get("server") or {}
    if srv:
        a(
            "A standalone server with one worker (one run each): the server's VmRSS once the job "
            "is done, the journal, and `kestrel job cat` printing every output (from the "
            "server's log, or reading the files).\n"
        )
        a(
            "| stdout | journal | submit --wait s | server VmRSS MiB (idle → after) | "
            "journal size | journal bytes/task | job cat s |"
        )
        a("|---|---|---|---|---|---|---|")
        for key, s in srv.items():
            mode, where = key.split("_")
            if "error" in s:
                a(f"| {mode} | {where} | failed: {s['error'][:200]} | | | | |")
                continue
            jb = s.get("journal_bytes")
            a(
                f"| {'`stream`' if mode == 'stream' else 'files'} | "
                f"{'on' if s.get('journal') else 'off (memory)'} | {fmt_s(s['seconds'])} | "
                f"{mib(s.get('idle_rss_kib'))} → {mib(s.get('rss_kib'))} | "
                f"{'—' if not jb else f'{jb / 2**20:.1f} MiB'} | "
                f"{'—' if not jb else f'{jb / n:.1f}'} | {fmt_s(s.get('cat_seconds'))} |"
            )
        a("")
    for m in ("stream", "files"):
        for err in (o.get(f"run_{m}") or {}).get("errors", []):
            a(f"- error: {err[:400]}")


def _per_task_us(fig: dict | None, tasks: int) -> float | None:
    s = med(fig, "seconds")
    return None if s is None else s / tasks * 1e6


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


def loaded_scenarios(res: dict) -> set[str]:
    """The scenarios with a sample that others' processes disturbed (see `Quiet.loaded`)."""
    return {
        name
        for name, sc in res["scenarios"].items()
        if any(Quiet.loaded(s) for s in _all_samples({"scenarios": {name: sc}}))
    }


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
