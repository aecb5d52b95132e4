"""The plots of the report (matplotlib), and installing matplotlib into a venv if it is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

from kbench.common import BENCH, log
from kbench.stats import med

# ----- matplotlib: the one dependency outside the standard library -----------------------------


def venv_root() -> Path:
    """The benchmark venv: $KESTREL_BENCH_VENV, else ~/.cache/kestrel-bench of the user who ran
    the benchmark (under sudo, the invoking user's home, not root's)."""
    if os.environ.get("KESTREL_BENCH_VENV"):
        return Path(os.environ["KESTREL_BENCH_VENV"]).expanduser()
    user = os.environ.get("SUDO_USER")
    home = Path(f"~{user}").expanduser() if user else Path.home()
    return home / ".cache" / "kestrel-bench"


def ensure_matplotlib() -> str | None:
    """Makes `import matplotlib` work, re-running this script in a venv if needed.

    Returns None when matplotlib can be imported, else why not (the suite then runs without the
    plot)."""
    try:
        import matplotlib  # noqa: F401

        return None
    except ImportError:
        pass
    if os.environ.get("KESTREL_BENCH_IN_VENV"):
        return "matplotlib is not importable even in the benchmark venv"
    root = venv_root()
    py = root / "bin" / "python"
    ok = (
        py.exists()
        and subprocess.run(
            [str(py), "-c", "import matplotlib"], check=False, capture_output=True
        ).returncode
        == 0
    )
    if not ok:
        log(f"matplotlib missing: installing it into {root} (once)")
        try:
            venv.create(root, with_pip=True)
            subprocess.run(
                [str(py), "-m", "pip", "install", "-q", "matplotlib"], check=True, timeout=1200
            )
        except (OSError, subprocess.SubprocessError) as e:
            return f"cannot install matplotlib into {root}: {e}"
    env = dict(os.environ, KESTREL_BENCH_IN_VENV="1")
    os.execve(str(py), [str(py), str(BENCH / "run.py"), *sys.argv[1:]], env)
    return None  # not reached


def plot_elsewhere(script: Path, res: dict, png: Path) -> bool:
    """Draws `png` from `res` by running `script --plot-only RES PNG` with the benchmark venv's
    Python, for a script run (as root) by a Python without matplotlib. False when there is no
    venv with matplotlib (`ensure_matplotlib` makes one) or the plot failed."""
    root = venv_root()
    py = root / "bin" / "python"
    if not py.exists() or os.environ.get("KESTREL_BENCH_IN_VENV"):
        log(f"no matplotlib (none in {root} either): {png.name} is not drawn")
        return False
    fd, name = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    tmp = Path(name)
    try:
        tmp.write_text(json.dumps(res))
        env = dict(os.environ, KESTREL_BENCH_IN_VENV="1")
        cmd = [str(py), str(script), "--plot-only", str(tmp), str(png)]
        return subprocess.run(cmd, env=env, check=False).returncode == 0
    finally:
        tmp.unlink(missing_ok=True)


# ----- plots -----------------------------------------------------------------------------------


def plot(res: dict, png: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib is not available ({e})"
    sc = res["scenarios"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2))
    t, n = sc.get("true"), sc.get("noop")

    def series(ax, pts, label, style):
        pts = sorted((c, r) for c, r in pts if r)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, lw=2, ms=7)

    if n:
        series(
            ax1,
            [(int(c), med(f)) for c, f in n["counts"].items()],
            f"Kestrel noop ({n['workers']} workers, dispatch only)",
            "o-",
        )
    if t:
        kc = [(int(c), med(f["kestrel_submit"])) for c, f in t["counts"].items()]
        kc.append((t["tasks"], med(t["kestrel_submit"])))
        series(ax1, kc, "Kestrel /bin/true (server + worker)", "s-")
        series(ax1, [(t["tasks"], med(t["kestrel_run"]))], "Kestrel /bin/true (`kestrel run`)", "D")
        xc = [(int(c), med(f.get("xargs"))) for c, f in t["counts"].items()]
        xc.append((t["tasks"], med(t.get("xargs"))))
        series(ax1, xc, "xargs -P 2 /bin/true", "^--")
        styles = {"hyperqueue": "v", "dask": "P", "parsl": "X"}
        for key, f in t["peers"].items():
            p, kind = key.split("/")
            what = "/bin/true" if kind == "true" else "python no-op"
            series(
                ax1,
                [(t["peer_tasks"], med(f))],
                f"{p} {what} ({t['peer_tasks']:,} tasks)",
                styles.get(p, "o"),
            )
    ax1.set_xscale("log")
    ax1.set_yscale("log")
    ax1.set_xlabel("tasks in the job")
    ax1.set_ylabel("tasks per second (median, end to end)")
    ax1.set_title("Throughput against task count (2 slots)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, loc="best")
    e = sc.get("efficiency")
    if e:
        pts = [(r["length_s"], (r.get("efficiency") or {})) for r in e["rows"]]
        pts = [(x, y) for x, y in pts if y]
        if pts:
            xs = [p[0] for p in pts]
            ys = [p[1]["median"] * 100 for p in pts]
            lo = [y - p[1]["min"] * 100 for y, p in zip(ys, pts)]
            hi = [p[1]["max"] * 100 - y for y, p in zip(ys, pts)]
            ax2.errorbar(
                xs,
                ys,
                yerr=[lo, hi],
                fmt="o-",
                lw=2,
                ms=7,
                capsize=4,
                label="Kestrel, sleep tasks (median, min–max)",
            )
            for x, y in zip(xs, ys):
                ax2.annotate(f"{y:.1f}%", (x, y), textcoords="offset points", xytext=(6, -14))
        ax2.axhline(100, color="gray", lw=1)
        ax2.axhline(95, color="red", ls="--", lw=1, label="target at 100 ms: 95%")
        ax2.set_xscale("log")
        ax2.set_ylim(0, 105)
        ax2.set_xlabel("task length (s)")
        ax2.set_ylabel("efficiency: ideal / measured wall time (%)")
        ax2.set_title("Efficiency against task length (2 slots)")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=8, loc="lower right")
    fig.suptitle(
        f"Kestrel benchmarks — {res['machine']['date']}, {res['machine']['nproc']} "
        f"cores, {res['machine']['cpu']}",
        fontsize=10,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return None


def chaos_plot(res: dict, png: Path) -> None:
    ch = res["scenarios"].get("chaos")
    if not ch:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(9, 4.2))
    pts = [(t, n) for t, n, ev in ch["timeline"] if ev != "server killed"]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", lw=2, label="tasks finished")
    kills = [t for t, _, ev in ch["timeline"] if ev == "server killed"]
    for i, t in enumerate(kills):
        ax.axvline(t, color="red", ls="--", lw=1, label="server SIGKILLed" if i == 0 else None)
    ax.set_xlabel("seconds since submission")
    ax.set_ylabel("tasks finished (as the server reports)")
    ax.set_title("Chaos test: a worker killed every second, the server killed twice")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
