"""The streamed-output scenario: `--stdout stream` (outputs kept by the server) against one file
per task, for many tiny outputs."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from kbench.cluster import Cluster
from kbench.common import SLOTS, log
from kbench.measure import SuiteBase, show
from kbench.procs import cmd_error, proc_status, run_cmd
from kbench.stats import measured

# Where each mode sends a task's stdout.
SINKS = {"stream": "stream", "files": "job-{job}/{task}.out"}


def _flags(tasks: int, mode: str) -> list:
    """The job's flags: `tasks` tasks, stdout as `mode` says, stderr discarded."""
    return ["--array", f"1-{tasks}", "--stdout", SINKS[mode], "--stderr", "none"]


def _expected(tasks: int) -> str:
    return "".join(f"{i}\n" for i in range(1, tasks + 1))


class OutputScenarios(SuiteBase):
    """Scenario `output`."""

    def run_echo(self, tasks: int, mode: str) -> dict:
        """`kestrel run` of `echo {task}` tasks with stdout streamed or in files; checks that
        every output is there (streamed ones are printed by `run`, in task order)."""
        d = Path(tempfile.mkdtemp(prefix=f"out-{mode}-", dir=self.root))
        try:
            r = run_cmd(
                [
                    self.kbin,
                    "run",
                    "--workers",
                    1,
                    "--slots",
                    SLOTS,
                    *_flags(tasks, mode),
                    "--quiet",
                    "--",
                    "echo",
                    "{task}",
                ],
                timeout=3600,
                cwd=d,
                env=dict(os.environ, TMPDIR=str(d)),
            )
            if r["rc"] != 0:
                raise RuntimeError(cmd_error(f"kestrel run --stdout {SINKS[mode]}", r))
            # Stdout holds the streamed outputs alone; the summary line is on stderr.
            summary = next((ln for ln in r["err"].splitlines() if " tasks on " in ln), "")
            if f"{tasks} finished" not in summary:
                raise RuntimeError(f"not every task finished: {r['err'][-300:]}")
            if mode == "stream" and r["out"] != _expected(tasks):
                raise RuntimeError("`kestrel run` did not print every output in task order")
            if mode == "files":
                files = sum(1 for _ in os.scandir(d / "job-1"))
                if files != tasks:
                    raise RuntimeError(f"{files} output files for {tasks} tasks")
        finally:
            shutil.rmtree(d, ignore_errors=True)
        return {
            "seconds": r["seconds"],
            "tasks": tasks,
            "rate": tasks / r["seconds"],
            "us_per_task": r["seconds"] / tasks * 1e6,
            "cpu_s": r["cpu_s"],
        }

    def server_echo(self, tasks: int, mode: str, journal: bool) -> dict:
        """A standalone server and one worker: the server's memory and journal after the job,
        and the time `kestrel job cat` takes to print every output."""
        with Cluster(self.kbin, self.root, f"out-{mode}", journal) as c:
            c.start_workers(1, SLOTS)
            time.sleep(0.5)
            idle = proc_status(c.server.pid)
            s = c.submit([*_flags(tasks, mode), ["echo", "{task}"]], tasks)
            after = proc_status(c.server.pid)
            s["journal_bytes"] = c.journal_bytes() if journal else None
            r = run_cmd(c.k("job", "cat", s["jobs"][0]), timeout=600, cwd=c.dir)
            if r["rc"] != 0:
                raise RuntimeError(cmd_error("kestrel job cat", r))
            if r["out"] != _expected(tasks):
                raise RuntimeError("`kestrel job cat` did not print every output in task order")
            s["cat_seconds"] = r["seconds"]
            s["idle_rss_kib"] = idle.get("VmRSS")
            s["rss_kib"] = after.get("VmRSS")
            s["hwm_kib"] = after.get("VmHWM")
        s.pop("submit_cpu_s", None)
        s["journal"] = journal
        return s

    def scenario_output(self) -> None:
        n = self.cfg["output_tasks"]
        log(f"scenario output: {n} x echo {{task}}, stdout streamed or in files, {SLOTS} slots")
        out: dict = {"tasks": n, "slots": SLOTS}
        for mode, sink in SINKS.items():
            samples = self.repeat(
                f"kestrel run --stdout {sink}",
                f"output run {mode}",
                self.run_echo,
                n,
                mode,
                describe=lambda s: show(s, extra=f"{s['us_per_task']:.0f} µs/task"),
            )
            out[f"run_{mode}"] = measured(samples)
        # One sample each: sizes, not times.
        server = {}
        for mode, sink in SINKS.items():
            for journal in (True, False):
                key = f"{mode}_{'journal' if journal else 'memory'}"
                log(f" server + worker, --stdout {sink}, journal {'on' if journal else 'off'}")
                s = self.attempt(f"output server {key}", self.server_echo, n, mode, journal)
                if "error" not in s:
                    jb = s["journal_bytes"]
                    log(
                        f"  server VmRSS {s['idle_rss_kib'] / 1024:.1f} -> "
                        f"{s['rss_kib'] / 1024:.1f} MiB"
                        + (f", journal {jb / n:.1f} B/task" if jb else "")
                        + f"; job cat {s['cat_seconds']:.2f} s"
                    )
                server[key] = s
        out["server"] = server
        self.res["output"] = out
