"""Issue 4's scenarios: the journal's cost, the restart time of a killed server, the chaos
test."""

from __future__ import annotations

import os
import signal
import time

from kbench.cluster import Cluster, counts_of
from kbench.common import REPO, log
from kbench.measure import SuiteBase, show
from kbench.procs import PROCS, cmd_error, run_cmd
from kbench.stats import measured, summary


class JournalScenarios(SuiteBase):
    """Scenarios `journal` (with the restart time) and `chaos`."""

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
                    show(s, extra=extra)
                fig = measured(samples)
                fig["journal_bytes"] = summary(
                    [x for x in samples if "journal_bytes" in x], "journal_bytes"
                )
                out[f"{kind}_{'on' if on else 'off'}"] = fig
        n = self.cfg["restart_tasks"]
        samples = self.repeat(
            f"restart with {n:,} finished + {n:,} queued tasks,",
            "restart",
            self.restart_one,
            n,
            slots,
            describe=lambda s: log(
                f"  journal {s['journal_bytes'] / 2**20:.1f} MiB; answers after "
                f"{s['ready_s']:.2f} s, dispatches after {s['dispatch_s']:.2f} s "
                f"(replay {s.get('replay', '?')})"
            ),
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
                if counts_of(info).get("finished", 0) > 0:
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
