"""Scenarios that spawn real task processes: /bin/true against the peers, and efficiency
against task length."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from kbench.cluster import counts_of
from kbench.common import PEERS_PY, SLOTS, log
from kbench.measure import SuiteBase, show
from kbench.procs import cmd_error, json_docs, loadavg, run_cmd
from kbench.stats import measured, summary


class SpawningScenarios(SuiteBase):
    """Scenarios `true` and `efficiency`."""

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
        finished = counts_of(j).get("finished")
        if finished != tasks:
            raise RuntimeError(f"only {finished} of {tasks} finished")
        return {
            "seconds": r["seconds"],
            "tasks": tasks,
            "rate": tasks / r["seconds"],
            "internal_wall_s": j["wall_us"] / 1e6 if "wall_us" in j else None,
            "cpu_s": r["cpu_s"],
        }

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
            show(s)
            log(f" run {r + 1}/{self.runs}: kestrel server + worker, submit --wait")
            s = self.attempt("kestrel submit", self.k_standalone, n, ["/bin/true"])
            figs["kestrel_submit"].append(s)
            show(s)
            if not self.peers_enabled:
                continue
            log(f" run {r + 1}/{self.runs}: xargs -P {SLOTS} (peers.py --only xargs)")
            s = self.attempt("xargs", lambda: self.peer("xargs", n)[0])
            figs["xargs"].append(s)
            show(s)
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
                    show(row, f"{p}/{row['workload']}")
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
                show(s)
                if self.peers_enabled:
                    log(f" {cnt} x /bin/true run {r + 1}/{self.runs}: xargs")
                    s = self.attempt("xargs", lambda c=cnt: self.peer("xargs", c)[0])
                    xs.append(s)
                    show(s)
            counts[str(cnt)] = {
                "kestrel_submit": measured(ks),
                "xargs": measured(xs) if self.peers_enabled else None,
            }
        out["counts"] = counts
        self.res["true"] = out

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
                show(s, extra=f"efficiency {s.get('efficiency', 0):.1%}")
            fig = measured(samples, length_s=length, tasks=n, ideal_s=ideal)
            fig["efficiency"] = summary([s for s in samples if "error" not in s], "efficiency")
            fig["span_efficiency"] = summary(
                [s for s in samples if "span_efficiency" in s], "span_efficiency"
            )
            runs = [s["timing"]["mean_run_us"] for s in samples if s.get("timing")]
            fig["mean_run_ms"] = statistics.median(runs) / 1000 if runs else None
            rows.append(fig)
        self.res["efficiency"] = {"slots": SLOTS, "rows": rows}
