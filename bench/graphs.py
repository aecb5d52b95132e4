#!/usr/bin/env python3
"""The Montage mosaic workflow on Kestrel (issue 13): the files between its stages (a) all
through a slow shared store and (b) kept in the workers' caches, against the serial run.

    sudo python3 bench/graphs.py [--grids 6,12] [--rate 100mbit] [--runs 1] [--no-build]
                                 [--out bench/results/graphs.json]
    python3 bench/graphs.py --report bench/results/graphs.json   # only rewrite the doc

For each grid G, in a fresh directory under /tmp: `make-tiles.py --grid G --size 512` (G x G
overlapping tiles of 1 MB in raw/); `run-serial.sh`, the reference mosaic and time (both from
`testsupport/montage/`); then `examples/montage/run.sh --mode store` and `--mode local`
on a server whose store is `testsupport/store/slow-store` serving that directory (nginx behind a
veth the kernel limits to --rate each way) and 4 workers of 2 slots. (a) `store`: every output
is `persist:` and the workers cache nothing (`--cache-size 0`), so each file between stages is
written to the store and read back from it; (b) `local`: outputs are `local:` (AME's collocated
store) and only the raw tiles and the mosaic cross the store.

Store traffic per stage: the bytes read are Kestrel's per-job counters (`kestrel job info
--output json`, transfers.store_bytes), since stages overlap in time and the store's own counter
cannot be split between them; the bytes written are the sizes of the files the stage left in the
store (each is written once; every task runs once or the run fails). The totals are checked
against the store's own counter (`slow-store stats`, which also counts TCP/IP and HTTP headers).
Each mosaic is compared with the serial one: `cmp`, else pixel by pixel with a small FITS reader
(equal when the largest difference is at floating-point rounding level). Writes the raw results
as JSON, docs/benchmarks-graphs.md and docs/graphs.png (with matplotlib, from the benchmark venv
if this Python lacks it). Needs root (the store's namespace) and Debian's Montage
(installed if missing); standard library only.
"""

from __future__ import annotations

import argparse
import array
import json
import math
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbench.plots import plot_elsewhere
from kbench.procs import stop_groups

REPO = Path(__file__).resolve().parent.parent
STORE = REPO / "testsupport" / "store" / "slow-store"
MONTAGE = REPO / "testsupport" / "montage"
RUN_SH = REPO / "examples" / "montage" / "run.sh"
WORKERS = 4
SLOTS = 2
TILE = 512
MODES = {"store": "0", "local": "4G"}  # worker cache size per mode
LABEL = {"store": "(a) store", "local": "(b) local"}
# Stages in the order they run; a job named `X.K` is chunk K of stage X (see
# examples/montage/montage.sh), except `mAdd.K`, the partial mosaics before the last mAdd.
STAGES = [
    "mImgtbl-raw",
    "mMakeHdr",
    "mProjectPP",
    "mImgtbl-proj",
    "mOverlaps",
    "mDiffFit",
    "mConcatFit",
    "mBgModel",
    "mBackground",
    "mAdd (partial)",
    "mAdd",
]
# Pixels equal "at floating-point rounding level": relative difference at most this (the
# mosaic is float64; summing the same values in another order moves the last bits).
ROUNDING = 1e-12


def log(msg: str) -> None:
    print(f"[graphs] {msg}", file=sys.stderr, flush=True)


def sh(argv: list[str], **kw) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def store_counter() -> tuple[int, int]:
    """Bytes the store has sent and received so far (its veth's counters)."""
    fields = dict(f.split("=") for f in sh([str(STORE), "stats"]).split())
    return int(fields["sent_bytes"]), int(fields["received_bytes"])


def children_cpu() -> float:
    """CPU seconds of this process's waited-for children (and theirs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all processes, /proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class Cluster:
    """A server on the store and its workers, in a fresh directory; stopped on exit."""

    def __init__(self, kestrel: str, url: str, cache: str, root: Path):
        self.k = kestrel
        self.root = root
        self.srv = root / "server"
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []
        logs = root / "logs"
        logs.mkdir(parents=True)
        try:
            self._start(logs, url, cache)
        except BaseException:
            # Started in their own sessions: nothing else would stop them.
            self.stop()
            raise

    def _start(self, logs: Path, url: str, cache: str) -> None:
        root = self.root
        self.spawn(
            ["server", "start", "--host", "127.0.0.1", "--no-journal"]
            + ["--store", url, "--policy", "good-cache-compute"],
            logs / "server.log",
        )
        deadline = time.time() + 20
        while not (self.srv / "access.json").exists():
            if time.time() > deadline or self.procs[0].poll() is not None:
                raise RuntimeError(f"the server did not start (see {logs})")
            time.sleep(0.05)
        for i in range(WORKERS):
            self.spawn(
                ["worker", "start", "--slots", str(SLOTS), "--cache-size", cache]
                + ["--cache-dir", str(root / f"cache-{i}")],
                logs / f"worker-{i}.log",
            )
        deadline = time.time() + 20
        while (
            len(json.loads(self.cli(["worker", "list", "--output", "json"]))["workers"]) < WORKERS
        ):
            if time.time() > deadline:
                raise RuntimeError("the workers did not register")
            time.sleep(0.1)

    def spawn(self, args: list[str], log_file: Path) -> None:
        out = log_file.open("w")
        self.logs.append(out)
        argv = [self.k, "--server-dir", str(self.srv), *args]
        self.procs.append(
            subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def cli(self, args: list[str]) -> str:
        return sh([self.k, "--server-dir", str(self.srv), *args], cwd=self.root)

    def json(self, args: list[str]) -> dict:
        return json.loads(self.cli([*args, "--output", "json"]))

    def stop(self) -> None:
        stop_groups(self.procs)
        for f in self.logs:
            f.close()


def stage_of(job_name: str) -> str:
    base, _, chunk = job_name.partition(".")
    return f"{base} (partial)" if base == "mAdd" and chunk else base


def output_patterns(info: dict) -> list[tuple[bool, re.Pattern]]:
    """A job's declared outputs as (literal, regex) over the names of the files they write."""
    out = []
    for name in info["outputs"]:
        for mode in ("local:", "persist:"):
            name = name.removeprefix(mode)
        literal = "{" not in name
        rx = re.sub(r"\\\{(line(:\d+)?|task|job)\\\}", "[^/]+", re.escape(name))
        out.append((literal, re.compile(rx + "$")))
    return out


def task_window(cl: Cluster, job: int) -> tuple[int, int]:
    """When the job's first task was given to a worker (which then staged its inputs) and its
    last one finished (µs)."""
    first, last, offset = None, None, 0
    while offset is not None:
        page = cl.json(["task", "list", str(job), "--offset", str(offset)])
        for t in page["tasks"]:
            begun = t.get("assigned_us") or t.get("started_us")
            if begun:
                first = min(first or begun, begun)
            if t.get("finished_us"):
                last = max(last or 0, t["finished_us"])
        offset = page["next_offset"]
    return first or 0, last or 0


def accounting(cl: Cluster, data: Path, mode: str) -> tuple[list[dict], dict]:
    """Per stage: tasks, store bytes read (Kestrel's counters), bytes written (the files the
    stage's jobs left in the store), bytes from caches, and when it ran; and the run's span."""
    jobs = cl.json(["job", "list"])["jobs"]
    infos = [cl.json(["job", "info", str(j["id"])]) for j in jobs]
    bad = [f"{i['name']} {i['state']}" for i in infos if i["state"] != "finished"]
    if bad:
        raise RuntimeError(f"jobs not finished: {bad}")
    t0 = min(i["submitted_us"] for i in infos)
    rows: dict[str, dict] = {}
    for info in infos:
        st = rows.setdefault(
            stage_of(info["name"]),
            dict.fromkeys(
                ("jobs", "tasks", "read_bytes", "store_reads", "peer_bytes", "local_bytes"),
                0,
            )
            | {"written_bytes": 0, "written_files": 0, "start_s": math.inf, "end_s": 0.0},
        )
        tr = info["transfers"]
        st["jobs"] += 1
        st["tasks"] += info["tasks"]
        st["read_bytes"] += tr["store_bytes"]
        st["store_reads"] += tr["store_reads"]
        st["peer_bytes"] += tr["peer_bytes"]
        st["local_bytes"] += tr["local_bytes"]
        first, last = task_window(cl, info["id"])
        st["start_s"] = min(st["start_s"], (first - t0) / 1e6)
        st["end_s"] = max(st["end_s"], (last - t0) / 1e6)
    # Each file in the store's folder of this run goes to the job that declared it: a literal
    # name first, then a pattern.
    pats = [(stage_of(i["name"]), output_patterns(i)) for i in infos]
    unclaimed = []
    for path in sorted((data / f"kestrel-{mode}").rglob("*")):
        if not path.is_file():
            continue
        name = str(path.relative_to(data))
        owner = next((s for s, ps in pats for lit, rx in ps if lit and rx.match(name)), None)
        owner = owner or next((s for s, ps in pats for lit, rx in ps if rx.match(name)), None)
        if owner is None:
            unclaimed.append(name)
            continue
        rows[owner]["written_bytes"] += path.stat().st_size
        rows[owner]["written_files"] += 1
    if unclaimed:
        raise RuntimeError(f"files in the store no job declared: {unclaimed[:5]}")
    span = (max(i["finished_us"] for i in infos) - t0) / 1e6
    stages = [{"stage": s, **rows[s]} for s in STAGES if s in rows]
    stages += [{"stage": s, **r} for s, r in rows.items() if s not in STAGES]
    return stages, {"jobs": len(infos), "span_s": span}


def read_fits(path: Path) -> tuple[list[str], int, int, array.array]:
    """The header cards and the 2-D image of a simple FITS file (BITPIX -64 or -32)."""
    raw = path.read_bytes()
    cards, off = [], 0
    while True:
        block = raw[off : off + 2880]
        off += 2880
        lines = [block[i : i + 80].decode("ascii") for i in range(0, 2880, 80)]
        cards += [c for c in lines if c.strip()]
        if any(c.startswith("END ") or c.rstrip() == "END" for c in lines):
            break
    kv = {c[:8].strip(): c[10:].split("/")[0].strip() for c in cards if c[8:10] == "= "}
    bitpix, n1, n2 = int(kv["BITPIX"]), int(kv["NAXIS1"]), int(kv["NAXIS2"])
    pixels = array.array({-64: "d", -32: "f"}[bitpix])
    pixels.frombytes(raw[off : off + n1 * n2 * abs(bitpix) // 8])
    if sys.byteorder == "little":
        pixels.byteswap()
    return cards, n1, n2, pixels


def compare(serial: Path, other: Path) -> dict:
    """Whether two mosaics are equal: byte for byte, or pixel by pixel at rounding level."""
    if serial.read_bytes() == other.read_bytes():
        return {"identical": True, "equal": True}
    ca, n1a, n2a, a = read_fits(serial)
    cb, n1b, n2b, b = read_fits(other)
    res = {
        "identical": False,
        "same_header": ca == cb,
        "shape": [[n1a, n2a], [n1b, n2b]],
        "pixels": 0,
        "differing": 0,
        "blank_mismatch": 0,
        "max_abs": 0.0,
        "max_rel": 0.0,
    }
    if (n1a, n2a) != (n1b, n2b):
        res["equal"] = False
        return res
    isnan = math.isnan
    for x, y in zip(a, b):
        if isnan(x) or isnan(y):
            res["blank_mismatch"] += isnan(x) != isnan(y)
            continue
        res["pixels"] += 1
        if x != y:
            d = abs(x - y)
            res["differing"] += 1
            res["max_abs"] = max(res["max_abs"], d)
            res["max_rel"] = max(res["max_rel"], d / max(abs(x), abs(y)))
    res["equal"] = res["same_header"] and not res["blank_mismatch"] and res["max_rel"] <= ROUNDING
    return res


def serial_run(data: Path) -> dict:
    c0, t0 = children_cpu(), time.time()
    out = sh(["bash", str(MONTAGE / "run-serial.sh"), str(data)])
    wall = time.time() - t0
    m = re.search(r"(\d+) tiles, (\d+) overlaps, (\d+) steps in ([\d.]+) s", out)
    if not m:
        raise RuntimeError(f"run-serial.sh said: {out}")
    tiles, overlaps, steps, secs = m.groups()
    return {
        "seconds": float(secs),
        "wall_s": wall,  # with mViewer's PNG, which its own time leaves out
        "cpu_s": children_cpu() - c0,
        "tiles": int(tiles),
        "overlaps": int(overlaps),
        "steps": int(steps),
    }


def kestrel_run(kestrel: str, url: str, data: Path, mode: str, scratch: Path) -> dict:
    """One run of examples/montage/run.sh on a fresh server and workers."""
    root = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=scratch))
    cl = Cluster(kestrel, url, MODES[mode], root)
    try:
        sent0, recv0 = store_counter()
        cpu0, busy0, load0 = children_cpu(), machine_busy(), os.getloadavg()[0]
        t0 = time.time()
        env = dict(os.environ, KESTREL=kestrel, TMPDIR=str(root))
        argv = [str(RUN_SH), str(data), "--mode", mode, "--server-dir", str(cl.srv)]
        r = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        wall = time.time() - t0
        sent1, recv1 = store_counter()
        if r.returncode:
            tails = "".join(
                f"--- {p.name}:\n{p.read_text()[-1500:]}" for p in sorted((root / "logs").iterdir())
            )
            raise RuntimeError(f"run.sh --mode {mode} failed:\n{r.stdout}{r.stderr[-3000:]}{tails}")
        m = re.search(r"in ([\d.]+) s", r.stdout)
        stages, span = accounting(cl, data, mode)
    finally:
        cl.stop()
    cpu = children_cpu() - cpu0
    busy = machine_busy() - busy0
    res = {
        "mode": mode,
        "seconds": float(m.group(1)) if m else wall,
        "wall_s": wall,
        **span,
        "store_sent_bytes": sent1 - sent0,
        "store_received_bytes": recv1 - recv0,
        "stages": stages,
        "read_bytes": sum(s["read_bytes"] for s in stages),
        "written_bytes": sum(s["written_bytes"] for s in stages),
        "tasks": sum(s["tasks"] for s in stages),
        # CPU of the server, workers and tasks (this process's children once stopped), and of
        # the whole machine meanwhile: other work on it shares its 2 cores.
        "cpu_s": cpu,
        "machine_busy_s": busy,
        "load_before": load0,
    }
    res["mosaic"] = compare(
        data / "serial" / "mosaic.fits", data / f"kestrel-{mode}" / "mosaic.fits"
    )
    shutil.rmtree(data / f"kestrel-{mode}", ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return res


def build(no_build: bool) -> None:
    if no_build:
        return
    for _ in range(3):
        log("building the release binary")
        cmd = ["cargo", "build", "--release", "-p", "kestrel-cli"]
        r = subprocess.run(cmd, cwd=REPO, check=False)
        if r.returncode == 0:
            return
        log("the build failed; trying again in a minute")
        time.sleep(60)
    log("the build kept failing: using target/release/kestrel as it is")


def ensure_montage() -> None:
    if shutil.which("mProjectPP"):
        return
    log("installing Montage (montage, montage-gridtools)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "montage", "montage-gridtools"], check=True, env=env
    )


def one_grid(kestrel: str, grid: int, runs: int, scratch: Path, rate: str, out: dict, save) -> None:
    data = scratch / f"g{grid}"
    log(f"G = {grid}: making {grid * grid} tiles")
    sh(
        [sys.executable, str(MONTAGE / "make-tiles.py"), str(data), "--grid", str(grid)]
        + ["--size", str(TILE)]
    )
    raw = sorted((data / "raw").glob("*.fits"))
    out.update(grid=grid, tiles=len(raw), raw_bytes=sum(p.stat().st_size for p in raw), runs=[])
    url = start_store(data, rate)
    try:
        for r in range(runs):
            one: dict = {"run": r, "serial": serial_run(data)}
            s = one["serial"]
            log(f"G = {grid} serial: {s['seconds']:.2f} s ({s['overlaps']} overlaps)")
            # Alternate which mode goes first, so neither always meets a warmer page cache.
            for mode in ("store", "local") if r % 2 == 0 else ("local", "store"):
                res = kestrel_run(kestrel, url, data, mode, scratch)
                log(
                    f"G = {grid} {LABEL[mode]}: {res['seconds']:.2f} s, store read "
                    f"{res['read_bytes'] / 1e6:.1f} MB written {res['written_bytes'] / 1e6:.1f} MB"
                    f" (counter {res['store_sent_bytes'] / 1e6:.1f} / "
                    f"{res['store_received_bytes'] / 1e6:.1f} MB), mosaic equal: "
                    f"{res['mosaic']['equal']}"
                )
                one[mode] = res
            out["runs"].append(one)
            save()
    finally:
        subprocess.run([str(STORE), "stop"], capture_output=True, check=False)
        shutil.rmtree(data, ignore_errors=True)


def start_store(data: Path, rate: str) -> str:
    sh([str(STORE), "start", str(data), rate])
    return sh([str(STORE), "url"]).strip()


def version_info(kestrel: str) -> dict:
    def git(*args: str) -> str:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return r.stdout.strip()

    return {
        "kestrel": sh([kestrel, "--version"]).strip(),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty_crates": bool(git("status", "--porcelain", "crates")),
        "cpus": os.cpu_count(),
    }


# ---------------------------------------------------------------------------------------------
# The report


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def mb(b: float) -> str:
    return f"{b / 1e6:,.1f}"


def write_doc(res: dict, doc: Path) -> None:
    L: list[str] = []
    a = L.append
    a("# Montage on Kestrel: intermediate data that never touches the shared store\n")
    a(
        f"Generated by `bench/graphs.py` ({res['date']}, {res['kestrel']} at {res['commit']}"
        f"{', with uncommitted changes under crates/' if res.get('dirty_crates') else ''}). "
        f"The real Montage mosaic workflow (Debian's Montage {res.get('montage', '')}, "
        "`testsupport/montage/`) expressed as a Kestrel workflow in "
        "[examples/montage/](../examples/montage/): mImgtbl + mMakeHdr, mProjectPP per tile, "
        "mOverlaps, mDiffFit per overlapping pair **submitted at run time by the mOverlaps "
        "task**, mConcatFit + mBgModel (whose task submits the rest), mBackground per tile, "
        "mImgtbl + mAdd. The raw tiles (512 x 512, 1 MB each) are in `testsupport/store/slow-store`"
        f" limited to {res['rate']} each way; {res['workers']} workers of {res['slots']} slots "
        f"on this {res['cpus']}-core machine; {res['runs']} run(s) of each, medians shown.\n"
    )
    a(
        "- **(a) store**: every file between stages is `persist:` and the workers cache "
        "nothing (`--cache-size 0`): each is written to the store and read back from it, as "
        "with a shared file system and no engine-managed data (AME's GPFS-only runs).\n"
        "- **(b) local**: every file between stages is `local:`: it stays in the cache of the "
        "worker that wrote it, and the tasks that read it are placed by the data-aware policy "
        "(good-cache-compute) and fetch it from that worker if they run elsewhere. Only the raw "
        "tiles and the mosaic cross the store.\n"
        "- **serial**: `run-serial.sh`, the pipeline one step after another on local disk, no "
        "engine and no store: the reference mosaic and time.\n"
    )
    a("## Time and correctness\n")
    a(
        "| G | tiles | overlaps | Kestrel tasks | serial s | (a) store s | (b) local s "
        "| (b) vs (a) | (b) vs serial | mosaic (a) / (b) = serial |"
    )
    a("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    grids = {g: G for g, G in res["grids"].items() if G.get("runs")}
    for g in sorted(grids, key=int):
        G = grids[g]
        runs = G["runs"]
        ser = med([r["serial"]["seconds"] for r in runs])
        st = med([r["store"]["seconds"] for r in runs])
        lo = med([r["local"]["seconds"] for r in runs])
        a(
            f"| {g} | {G['tiles']} | {runs[0]['serial']['overlaps']} | "
            f"{runs[0]['local']['tasks']} | {ser:.1f} | {st:.1f} | {lo:.1f} | "
            f"{st / lo:.2f}x faster | {lo / ser:.2f}x the time | "
            f"{_mosaic_word(runs, 'store')} / {_mosaic_word(runs, 'local')} |"
        )
    a("")
    per_s = _rate_bytes(res["rate"])
    for g in sorted(grids, key=int):
        runs = grids[g]["runs"]
        lo = {k: med([r["local"][k] for r in runs]) for k in ("read_bytes", "written_bytes")}
        st = {k: med([r["store"][k] for r in runs]) for k in ("read_bytes", "written_bytes")}
        a(
            f"At G = {g}, (b) reads {mb(lo['read_bytes'])} MB from the store (the raw tiles, "
            f"before the first projection can start) and writes {mb(lo['written_bytes'])} MB "
            f"(the mosaic, after the last mAdd): at {res['rate']} that is "
            f"{(lo['read_bytes'] + lo['written_bytes']) / per_s:.1f} s of the run by itself, "
            "which the serial run, on local disk, does not have. (a) reads "
            f"{mb(st['read_bytes'])} MB and writes {mb(st['written_bytes'])} MB: at least "
            f"{max(st['read_bytes'], st['written_bytes']) / per_s:.1f} s even if every read "
            "overlapped every write.\n"
        )
    a(
        "Mosaic check: `cmp` first; when the bytes differ, a small FITS reader compares the "
        "headers (equal), the blank pixels (the same) and the values, which are equal when the "
        f"largest relative difference is at most {ROUNDING:g} (the mosaic is float64; tiles "
        "summed in another order differ in the last bits).\n"
    )
    png = doc.parent / "graphs.png"
    if _plot(res, png):
        a(f"![Montage: time per grid, and store traffic per stage]({png.name})\n")
    for g in sorted(grids, key=int):
        _traffic_section(a, g, grids[g])
    _cpu_section(a, grids)
    _notes(a)
    doc.write_text("\n".join(L).rstrip() + "\n")
    log(f"wrote {doc}")


def _plot(res: dict, png: Path) -> bool:
    """docs/graphs.png: the run times per grid, and each stage's store traffic at the largest
    grid, (a) against (b)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return plot_elsewhere(Path(__file__), res, png)
    grids = {g: G for g, G in res["grids"].items() if G.get("runs")}
    gs = sorted(grids, key=int)
    if not gs:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), width_ratios=[1, 1.6])
    modes = [("serial", "serial", "tab:grey"), ("store", "(a) store", "tab:red")]
    modes.append(("local", "(b) local", "tab:blue"))
    width = 0.26
    for k, (mode, label, color) in enumerate(modes):
        secs = [med([r[mode]["seconds"] for r in grids[g]["runs"]]) for g in gs]
        xs = [i + (k - 1) * width for i in range(len(gs))]
        bars = ax1.bar(xs, secs, width, label=label, color=color)
        ax1.bar_label(bars, fmt="%.0f", fontsize=8)
    ax1.set_xticks(range(len(gs)), [f"G = {g}\n({grids[g]['tiles']} tiles)" for g in gs])
    ax1.set_ylabel("run time (s), median")
    ax1.set_title("Montage mosaic, time")
    ax1.legend()
    big = gs[-1]
    runs = grids[big]["runs"]
    sa, sb = _stage_rows(runs, "store"), _stage_rows(runs, "local")
    stages = [st for st in STAGES if st in sa or st in sb]
    ys = range(len(stages))
    for k, (rows, label, color) in enumerate(
        [(sa, "(a) store", "tab:red"), (sb, "(b) local", "tab:blue")]
    ):
        mbs = [
            (rows.get(st, {}).get("read_bytes", 0) + rows.get(st, {}).get("written_bytes", 0)) / 1e6
            for st in stages
        ]
        ax2.barh([y + (-0.2 if k == 0 else 0.2) for y in ys], mbs, 0.4, label=label, color=color)
    ax2.set_yticks(list(ys), stages)
    ax2.invert_yaxis()
    ax2.set_xlabel("MB read from and written to the store, median")
    ta = med([r["store"]["read_bytes"] + r["store"]["written_bytes"] for r in runs]) / 1e6
    tb = med([r["local"]["read_bytes"] + r["local"]["written_bytes"] for r in runs]) / 1e6
    ax2.set_title(
        f"store traffic per stage, G = {big}: {ta:,.0f} MB (a), {tb:,.0f} MB (b), "
        f"{(1 - tb / ta) * 100 if ta else float('nan'):.0f}% less"
    )
    ax2.legend()
    fig.suptitle(f"slow store at {res['rate']}, {res['workers']} workers x {res['slots']} slots")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def _mosaic_word(runs: list[dict], mode: str) -> str:
    checks = [r[mode]["mosaic"] for r in runs]
    if all(c.get("identical") for c in checks):
        return "identical"
    if all(c["equal"] for c in checks):
        worst = max(c.get("max_rel", 0.0) for c in checks)
        return f"equal (max rel. diff {worst:.1e})"
    return "**DIFFERENT**"


def _stage_rows(runs: list[dict], mode: str) -> dict[str, dict]:
    """Per stage, the median over runs of each figure."""
    out: dict[str, dict] = {}
    for stage in STAGES:
        rows = [s for r in runs for s in r[mode]["stages"] if s["stage"] == stage]
        if rows:
            out[stage] = {k: med([s[k] for s in rows]) for k in rows[0] if k != "stage"}
    return out


def _traffic_section(a, g: str, G: dict) -> None:
    runs = G["runs"]
    sa, sb = _stage_rows(runs, "store"), _stage_rows(runs, "local")
    a(f"## Store traffic per stage, G = {g} ({G['tiles']} tiles)\n")
    a(
        "In the shape of AME's Table 2 (MB through the shared store; AME's 6x6-degree run on "
        "512 cores went from 62,500 MB to 16,901 MB, 73% less). *Read* is what the stage's "
        "tasks read from the store (Kestrel's counters), *written* the files the stage left in "
        "it. In (b), what the tasks read came from their own worker's cache (local) or from "
        "another worker's (peer) instead.\n"
    )
    a(
        "| stage | tasks | (a) read | (a) written | (b) read | (b) written "
        "| (b) local hits | (b) from peers |"
    )
    a("|---|---:|---:|---:|---:|---:|---:|---:|")
    for stage in STAGES:
        x, y = sa.get(stage), sb.get(stage)
        if not x and not y:
            continue
        x = x or {}
        y = y or {}
        a(
            f"| {stage} | {int((y or x).get('tasks', 0))} | {mb(x.get('read_bytes', 0))} "
            f"| {mb(x.get('written_bytes', 0))} | {mb(y.get('read_bytes', 0))} "
            f"| {mb(y.get('written_bytes', 0))} | {mb(y.get('local_bytes', 0))} "
            f"| {mb(y.get('peer_bytes', 0))} |"
        )
    ta = med([r["store"]["read_bytes"] + r["store"]["written_bytes"] for r in runs])
    tb = med([r["local"]["read_bytes"] + r["local"]["written_bytes"] for r in runs])
    ra = med([r["store"]["read_bytes"] for r in runs])
    wa = med([r["store"]["written_bytes"] for r in runs])
    rb = med([r["local"]["read_bytes"] for r in runs])
    wb = med([r["local"]["written_bytes"] for r in runs])
    a(f"| **total** | | **{mb(ra)}** | **{mb(wa)}** | **{mb(rb)}** | **{mb(wb)}** | | |")
    ca = med([r["store"]["store_sent_bytes"] + r["store"]["store_received_bytes"] for r in runs])
    cb = med([r["local"]["store_sent_bytes"] + r["local"]["store_received_bytes"] for r in runs])
    sent = {m: med([r[m]["store_sent_bytes"] for r in runs]) for m in MODES}
    recv = {m: med([r[m]["store_received_bytes"] for r in runs]) for m in MODES}
    a(
        f"| store's own counter (sent / received) | | {mb(sent['store'])} | "
        f"{mb(recv['store'])} | {mb(sent['local'])} | {mb(recv['local'])} | | |"
    )
    a("")
    cut = 1 - tb / ta if ta else float("nan")
    cut_counter = 1 - cb / ca if ca else float("nan")
    a(
        f"**Total store traffic: {mb(ta)} MB in (a), {mb(tb)} MB in (b): {cut * 100:.1f}% less** "
        f"(the store's own counter, headers included: {mb(ca)} MB and {mb(cb)} MB, "
        f"{cut_counter * 100:.1f}% less). The issue asks for at least 70%.\n"
    )
    a(
        "When each stage ran, in seconds from the first submission: from its first task given to "
        "a worker (which then stages the task's inputs) to its last task's end.\n"
    )
    a("| stage | (a) store | (b) local |")
    a("|---|---:|---:|")
    for stage in STAGES:
        x, y = sa.get(stage), sb.get(stage)
        if x or y:
            a(f"| {stage} | {_window(x)} | {_window(y)} |")
    a("")


def _rate_bytes(rate: str) -> float:
    """Bytes per second of a tc rate such as 100mbit."""
    for unit, bits in (("kbit", 1e3), ("mbit", 1e6), ("gbit", 1e9)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * bits / 8
    return float("nan")


def _window(s: dict | None) -> str:
    return f"{s['start_s']:.1f} – {s['end_s']:.1f}" if s else ""


def _cpu_section(a, grids: dict) -> None:
    a("## CPU\n")
    a(
        "CPU seconds used by the run itself (server, workers, tasks; serial: the script and its "
        "tools), and what the rest of the machine used meanwhile (`/proc/stat` less the run's "
        "own: other users' work, and the kernel's for the store's shaped link). Whatever else "
        "runs shares the 2 cores: the times are only as steady as the machine was. Kestrel's "
        "tasks cost more CPU than the serial steps: each is a shell script that links its "
        "inputs into a scratch directory, and the worker copies each output into its cache, "
        "hashing it (BLAKE3), and serves or fetches inputs between workers over HTTP.\n"
    )
    a(
        "| G | serial CPU s | (a) CPU s | (b) CPU s "
        "| other processes' CPU during (a) / (b), cores in use on average |"
    )
    a("|---:|---:|---:|---:|---|")
    for g in sorted(grids, key=int):
        runs = grids[g]["runs"]
        ser = med([r["serial"]["cpu_s"] for r in runs])
        ca = med([r["store"]["cpu_s"] for r in runs])
        cb = med([r["local"]["cpu_s"] for r in runs])
        ba, bb = (
            med([(r[m]["machine_busy_s"] - r[m]["cpu_s"]) / r[m]["wall_s"] for r in runs])
            for m in ("store", "local")
        )
        a(f"| {g} | {ser:.1f} | {ca:.1f} | {cb:.1f} | {ba:.2f} / {bb:.2f} |")
    a("")


def _notes(a) -> None:
    a("## How the workflow is cut into tasks\n")
    a(
        "- A Kestrel task declares at most 64 input files (`MAX_TASK_FILES` in crates/core), and "
        "Montage's reductions read one or two files per tile or per overlap. Each reduction is "
        "therefore a two-level tree: the same tool on chunks of at most 60 files (mImgtbl over "
        "a chunk of raw tiles, mConcatFit over a chunk of fits, mAdd over a chunk of corrected "
        "tiles in grid order, a compact band of the sky), then one task over the partial "
        "results. The partial mosaics carry their area files, so the last mAdd computes the "
        "same area-weighted mean; their bytes are the `mAdd (partial)` row, traffic the serial "
        "run does not have.\n"
        "- mImgtbl reads only FITS headers, but Kestrel stages whole files: so that mOverlaps "
        "does not stage every projected tile, each mProjectPP task also writes its tile's line "
        "of the image table (mImgtbl on that one tile), and `mImgtbl-proj` concatenates them.\n"
        "- mDiffFit's difference images are declared outputs that nothing reads, as in AME's "
        "table (mDiffFit out): persisted in (a), kept in the caches and deleted at the end in "
        "(b).\n"
        "- mBgModel's corrections depend, in their last printed digits, on the order of the "
        "images in the image table (at G = 12, a table in tile-name order instead of the serial "
        "run's changes corrections by up to 0.001 and mosaic pixels by up to 1e-5 of their "
        "value). run-serial.sh lists the projected tiles with `mImgtbl proj`, in the file "
        "system's directory order; the mOverlaps task orders the table's lines the same way "
        "(`ls -f` of a directory of the tiles' names), so the mosaics agree to rounding.\n"
        "- Kestrel records a task's end when its process ends; the upload of its `persist:` "
        "outputs to the store comes after, and is in no part of `job info`'s timing. In (a) the "
        "stage windows above therefore leave gaps (the partial mosaics take seconds to upload), "
        "and in (b) the last mAdd ends before the mosaic's upload, which the run's time "
        "includes.\n"
    )


# ---------------------------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--plot-only":
        return 0 if _plot(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])) else 1
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--report", help="only rewrite the doc from this raw results file")
    ap.add_argument("--grids", default="6,12")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "graphs.json"))
    a = ap.parse_args()
    doc = REPO / "docs" / "benchmarks-graphs.md"
    if a.report:
        write_doc(json.loads(Path(a.report).read_text()), doc)
        return 0
    if os.geteuid() != 0:
        log("needs root: the slow store lives in its own network namespace")
        return 2
    # Stopped with SIGTERM, it still stops its servers, workers and store, and cleans up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ensure_montage()
    build(a.no_build)
    scratch = Path(tempfile.mkdtemp(prefix="kgraphs-"))
    try:
        # A copy of the binary: a rebuild meanwhile must not change it under the run.
        kestrel = str(scratch / "kestrel")
        shutil.copy2(REPO / "target" / "release" / "kestrel", kestrel)
        montage = sh(["dpkg-query", "-W", "-f", "${Version}", "montage"]).strip()
        results: dict = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "rate": a.rate,
            "workers": WORKERS,
            "slots": SLOTS,
            "tile": TILE,
            "runs": a.runs,
            "montage": montage,
            **version_info(kestrel),
            "grids": {},
        }
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)

        def save() -> None:
            out.write_text(json.dumps(results, indent=1))

        for grid in (int(g) for g in a.grids.split(",")):
            results["grids"][str(grid)] = {}
            one_grid(kestrel, grid, a.runs, scratch, a.rate, results["grids"][str(grid)], save)
    finally:
        subprocess.run([str(STORE), "stop"], capture_output=True, check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    log(f"raw results in {a.out}")
    write_doc(results, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
