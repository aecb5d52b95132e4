"""Set-up: what machine this is, building the release binary, and a private copy of it."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

from kbench.common import REPO, log


def sh(argv: list[str], cwd: Path = REPO) -> str:
    try:
        return subprocess.run(
            argv, check=False, capture_output=True, text=True, cwd=cwd, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        mem = f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "nproc": sh(["nproc"]) or str(os.cpu_count()),
        "cpu": cpu,
        "kernel": platform.release(),
        "os": sh(["uname", "-sm"]),
        "memory": mem,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def build(retries: int) -> None:
    for i in range(retries):
        log(f"cargo build --release (attempt {i + 1}/{retries})")
        p = subprocess.run(
            ["cargo", "build", "--release"], check=False, cwd=REPO, capture_output=True, text=True
        )
        if p.returncode == 0:
            return
        log(f"build failed:\n{p.stderr[-1500:]}")
        if i + 1 < retries:
            log("waiting 60 s (others may be mid-edit) and retrying")
            time.sleep(60)
    raise SystemExit("cargo build --release failed; see above")


def kestrel_copy(root: Path) -> tuple[str, dict]:
    """Copies the binary, so a rebuild by someone else during the suite changes nothing."""
    src = REPO / "target" / "release" / "kestrel"
    if not src.exists():
        raise SystemExit(f"{src} does not exist; build it with cargo build --release")
    dst = root / "kestrel"
    shutil.copy2(src, dst)
    digest = hashlib.sha256(dst.read_bytes()).hexdigest()
    info = {
        "version": sh([str(dst), "--version"]),
        "sha256": digest[:16],
        "commit": sh(["git", "rev-parse", "--short", "HEAD"]),
        "dirty": bool(
            sh(["git", "status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"])
        ),
        "built": dt.datetime.fromtimestamp(src.stat().st_mtime, dt.UTC).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
    }
    return str(dst), info
