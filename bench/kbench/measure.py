"""The suite's shared state, one guarded measurement (`attempt`), and the Kestrel runs that
several scenarios time."""

from __future__ import annotations

from pathlib import Path

from kbench.cluster import Cluster
from kbench.common import SLOTS, log
from kbench.procs import Quiet, cpu_mark, loadavg, others_busy, others_cores, proc_status


class SuiteBase:
    """What every scenario shares: the settings, the results so far, the idle-wait budget."""

    def __init__(self, args, cfg: dict, kbin: str, root: Path) -> None:
        self.args, self.cfg, self.kbin, self.root = args, cfg, kbin, root
        self.runs = cfg["runs"]
        self.res: dict = {}
        self.peers_enabled = not args.no_peers and not args.quick
        self.peer_dead: dict[str, str] = {}
        self.quiet = Quiet(args.idle_wait)

    def repeat(self, label: str, what: str, fn, *a, describe=None, **kw) -> list[dict]:
        """`self.runs` attempts of `fn(*a, **kw)`, each announced as "<label> run r/N"; a
        successful sample is logged by `describe` (default: `show`)."""
        samples = []
        for r in range(self.runs):
            log(f" {label} run {r + 1}/{self.runs}")
            s = self.attempt(what, fn, *a, **kw)
            samples.append(s)
            if "error" not in s:
                (describe or show)(s)
        return samples

    def attempt(self, what: str, fn, *a, **kw) -> dict:
        """One measurement; a failure becomes {"error": ...} instead of ending the suite."""
        env = self.quiet.wait()
        busy = others_busy()
        env["load1"] = loadavg()
        if busy:
            env["others_busy"] = busy
        mark = cpu_mark()
        try:
            s = fn(*a, **kw)
        except Exception as e:  # noqa: BLE001 - recorded in the results and the report
            log(f"  {what}: FAILED: {e}")
            return {"error": f"{what}: {e}", **env}
        env["others_cores_during"] = round(others_cores(mark), 2)
        if env["others_cores_during"] > Quiet.THRESHOLD:
            log(
                f"  machine busy: other processes used {env['others_cores_during']:.1f} cores "
                "while this ran; a target its scenario misses is not judged (no FAIL)"
            )
        s.update(env)
        return s

    def k_standalone(
        self,
        tasks: int,
        argv: list[str],
        slots: int = SLOTS,
        name: str = "true",
        journal: bool = True,
        tls: bool = False,
    ) -> dict:
        with Cluster(self.kbin, self.root, name, journal, tls=tls) as c:
            c.start_workers(1, slots)
            cpu0 = c.cpu()
            s = c.submit(
                ["--array", f"1-{tasks}", "--stdout", "none", "--stderr", "none", argv], tasks
            )
            cpu1 = c.cpu()
            info = c.job_info(s["jobs"][0])
        s["timing"] = info.get("timing")
        s["span_s"] = _span(info)
        s["cpu"] = {
            "server_s": cpu1["server"].get("self_s", 0) - cpu0["server"].get("self_s", 0),
            "worker_s": cpu1["workers_self_s"] - cpu0["workers_self_s"],
            "tasks_s": cpu1["workers_children_s"] - cpu0["workers_children_s"],
            "submit_s": s.pop("submit_cpu_s"),
        }
        return s

    def k_noop(
        self,
        tasks: int,
        workers: int,
        slots: int,
        prefetch: int | None = None,
        name: str = "noop",
        journal: bool = True,
        tls: bool = False,
    ) -> dict:
        with Cluster(self.kbin, self.root, name, journal, tls=tls) as c:
            connect_s = c.start_workers(
                workers, slots, prefetch, exec_mode="noop", timeout=max(120, workers)
            )
            rss_workers = sum(proc_status(w.pid).get("VmRSS", 0) for w in c.workers)
            cpu0 = c.cpu()
            s = c.submit(
                ["--array", f"1-{tasks}", "--stdout", "none", "--stderr", "none", ["/bin/true"]],
                tasks,
            )
            cpu1 = c.cpu()
            s["server_rss_kib"] = proc_status(c.server.pid)
            s["journal_bytes"] = c.journal_bytes()
            if workers > 2:
                per = [w.get("finished", 0) for w in c.worker_list()]
                s["per_worker_finished"] = {
                    "min": min(per),
                    "max": max(per),
                    "idle_workers": sum(1 for x in per if x == 0),
                }
        s["connect_s"] = connect_s
        s["workers_rss_kib"] = rss_workers
        s["cpu"] = {
            "server_s": cpu1["server"].get("self_s", 0) - cpu0["server"].get("self_s", 0),
            "workers_s": cpu1["workers_self_s"] - cpu0["workers_self_s"],
            "submit_s": s.pop("submit_cpu_s"),
        }
        return s


def _span(info: dict) -> float | None:
    t = (info or {}).get("timing") or {}
    return t["span_us"] / 1e6 if t.get("span_us") else None


def show(s: dict, label: str = "", extra: str = "") -> None:
    if "error" in s:
        return
    msg = (
        f"  {label + ': ' if label else ''}{s['tasks']} tasks in {s['seconds']:.3f} s = "
        f"{s['rate']:,.0f} tasks/s"
    )
    log(msg + (f"; {extra}" if extra else ""))
