"""The processes the suite starts (each in its own process group, all stopped at the end),
running a command to its end, /proc readers, and waiting for the machine to be idle."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

from kbench.common import log


class Procs:
    """Every long-running process the suite starts, each in its own process group."""

    def __init__(self) -> None:
        self.live: list[subprocess.Popen] = []

    def start(self, argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, **kw)
        self.live.append(p)
        return p

    def stop(self, p: subprocess.Popen, grace: float = 10.0) -> None:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        else:
            # The leader is gone; its group may not be.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if p in self.live:
            self.live.remove(p)

    def stop_all(self) -> None:
        for p in list(self.live):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in list(self.live):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self.stop(p, grace=1)


PROCS = Procs()


def stop_groups(procs: list[subprocess.Popen], grace: float = 10.0) -> None:
    """Stops processes each leading its own process group: SIGTERM to every group, then
    SIGKILL to those still there after `grace` seconds."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def run_cmd(
    argv: list[str], timeout: float, cwd: str | Path | None = None, env: dict | None = None
) -> dict:
    """Runs a command to its end in its own process group; times it (wall and CPU)."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = PROCS.start(
        [str(a) for a in argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
    )
    try:
        out, err = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        PROCS.stop(p, grace=2)
        out, err = p.communicate()
        timed_out = True
    secs = time.perf_counter() - t
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p in PROCS.live:
        PROCS.live.remove(p)
    return {
        "rc": p.returncode,
        "out": out,
        "err": err,
        "seconds": secs,
        "timed_out": timed_out,
        "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
    }


def cmd_error(what: str, r: dict) -> str:
    if r["timed_out"]:
        return f"{what}: timed out after {r['seconds']:.0f} s; stderr: {r['err'][-800:]}"
    return f"{what}: exit {r['rc']}; stderr: {r['err'][-800:]}"


def json_docs(text: str) -> list:
    """The JSON documents printed one after another."""
    dec, docs, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        doc, i = dec.raw_decode(text, i)
        docs.append(doc)


def proc_status(pid: int) -> dict:
    """VmRSS / VmHWM (KiB) of a live process."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def proc_cpu(pid: int) -> dict:
    """CPU seconds of a live process: its own and its reaped children's (the tasks it ran)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return {}
    hz = os.sysconf("SC_CLK_TCK")
    return {"self_s": (int(f[11]) + int(f[12])) / hz, "children_s": (int(f[13]) + int(f[14])) / hz}


def others_busy() -> list[str]:
    """Build or test processes of other people running now (noise on a 2-core machine)."""
    names = {"cargo", "rustc", "cc1", "ld", "cc", "rust-lld", "clippy-driver", "rustdoc"}
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                comm = (d / "comm").read_text().strip()
            except OSError:
                continue
            if comm in names or comm.startswith("kestrel_") or comm.endswith("-test"):
                found.append(comm)
    return sorted(found)


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cores_busy(interval: float = 1.0) -> float:
    """How many cores were busy (anyone's processes) over the next `interval` seconds."""

    def snap() -> tuple[int, int]:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
        return sum(v), v[3] + v[4]

    t0, i0 = snap()
    time.sleep(interval)
    t1, i1 = snap()
    return (1 - (i1 - i0) / max(1, t1 - t0)) * (os.cpu_count() or 1)


def cpu_mark() -> tuple[float, float, float]:
    """Now, the machine's busy CPU seconds so far, and the CPU seconds of this process and of
    its children that were waited for (with everything they waited for in turn: the servers,
    workers and tasks the suite started and stopped)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    busy = (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    own = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return time.monotonic(), busy, own


def others_cores(since: tuple[float, float, float]) -> float:
    """Cores that other people's processes used, on average, since `cpu_mark()` gave `since`:
    the machine's busy time less the suite's own. Exact once every process the suite started
    in between has been waited for."""
    now = cpu_mark()
    wall = now[0] - since[0]
    if wall <= 0:
        return 0.0
    return max(0.0, ((now[1] - since[1]) - (now[2] - since[2])) / wall)


class Quiet:
    """Before a measurement, waits (within a budget) until nobody else is using the CPU."""

    THRESHOLD = 0.3  # cores busy with other people's work

    @staticmethod
    def loaded(sample: dict) -> bool:
        """Whether others used the CPU when the sample started or while it ran: a figure that
        says more about them than about Kestrel."""
        return (
            sample.get("busy_cores_before", 0) > Quiet.THRESHOLD
            or sample.get("others_cores_during", 0) > Quiet.THRESHOLD
        )

    def __init__(self, budget_s: float, per_sample_s: float = 180) -> None:
        self.budget, self.per_sample = budget_s, per_sample_s
        self.waited = 0.0

    def wait(self) -> dict:
        t = time.monotonic()
        busy = cores_busy()
        limit = min(self.per_sample, self.budget - self.waited)
        announced = False
        while busy > self.THRESHOLD and time.monotonic() - t < limit:
            if not announced:
                log(
                    f"  machine busy ({busy:.1f} cores used by others: "
                    f"{', '.join(others_busy()) or 'unknown'}); waiting up to {limit:.0f} s"
                )
                announced = True
            time.sleep(4)
            busy = cores_busy()
        waited = time.monotonic() - t
        self.waited += waited
        return {"busy_cores_before": round(busy, 2), "waited_s": round(waited, 1)}
