"""The server-memory scenario: a large array and many distinct command lines, no workers."""

from __future__ import annotations

import time
from pathlib import Path

from kbench.cluster import Cluster, counts_of
from kbench.common import log
from kbench.measure import SuiteBase
from kbench.procs import proc_status
from kbench.stats import measured, summary


class MemoryScenarios(SuiteBase):
    """Scenario `memory`."""

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
            # A kestrel from before the JSON vocabulary (an A/B baseline) lists only counts.
            total = sum(j.get("tasks", sum(counts_of(j).values())) for j in jobs)
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
            samples = self.repeat(
                f"{kind} {n}",
                f"memory {kind}",
                self.mem_one,
                kind,
                n,
                each_file,
                describe=lambda s: log(
                    f"  idle {s['idle_rss_kib'] / 1024:.1f} MiB, after submit VmRSS "
                    f"{s['rss_kib'] / 1024:.1f} MiB, VmHWM {s['hwm_kib'] / 1024:.1f} MiB "
                    f"(submit {s['seconds']:.2f} s)"
                ),
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
