"""A standalone Kestrel server with workers, driven through the `kestrel` command line."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

from kbench.procs import PROCS, cmd_error, json_docs, proc_cpu, run_cmd


def listing(doc, key: str) -> list:
    """A listing as kestrel prints it: `{"<key>": [...]}`, or a bare array from a kestrel of
    before the JSON vocabulary (the baseline of an A/B run)."""
    return doc[key] if isinstance(doc, dict) else doc


def counts_of(doc: dict) -> dict:
    """A job's counts from `job info`/`run` JSON, of this kestrel or of one from before the
    JSON vocabulary (`summary.counts`, or counts at the top of `run`'s document)."""
    return doc.get("counts") or doc.get("summary", {}).get("counts") or doc


class Cluster:
    """A `kestrel server start` on 127.0.0.1 in a fresh directory, plus workers."""

    def __init__(
        self,
        kbin: str,
        root: Path,
        name: str,
        journal: bool = True,
        env: dict | None = None,
        tls: bool = False,
    ) -> None:
        self.kbin = kbin
        self.journal = journal
        self.tls = tls  # `--tls`: encrypted although on loopback, to measure what TLS costs
        self.env = env  # the server's environment (default: this one)
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
        if self.tls:
            argv.append("--tls")
        self.server = PROCS.start(argv, stdout=log_f, stderr=log_f, cwd=self.dir, env=self.env)
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
        return listing(json.loads(r["out"]), "workers")

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
        argv = self.k("job", "list", "--last", "0", "--output", "json")
        r = run_cmd(argv, timeout=120, cwd=self.dir)
        if r["rc"] != 0:
            # A kestrel from before `--last` (the baseline of an A/B run) lists every job.
            r = run_cmd(self.k("job", "list", "--output", "json"), timeout=120, cwd=self.dir)
        if r["rc"] != 0:
            raise RuntimeError(cmd_error("kestrel job list", r))
        return listing(json.loads(r["out"]), "jobs")

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
