"""Settings shared by the whole suite: paths, scenario names and sizes, and progress logging."""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
PEERS_PY = REPO.parent / "shared" / "anchors" / "peers.py"
DOC = REPO / "docs" / "benchmarks.md"
SCENARIOS = ["true", "noop", "efficiency", "memory", "workers", "journal", "chaos", "output"]
SLOTS = 2  # every scenario runs on 2 task slots (the machine's cores)

FULL = {
    "runs": 3,
    "true_tasks": 100_000,
    "true_counts": [10_000, 20_000],
    "peer_tasks": 20_000,
    "noop_workers": 2,
    "noop_counts": [10_000, 100_000, 1_000_000],
    "noop_tune_slots": [16, 64, 256, 1024, 4096],
    "efficiency": [[0.01, 2000], [0.1, 200], [1.0, 20]],
    "mem_array": 10_000_000,
    "mem_each": 1_000_000,
    "scale_workers": 200,
    "scale_tasks": 1_000_000,
    "scale_tune_slots": [16, 64, 256, 1024],
    "journal_noop": 1_000_000,
    "journal_true": 100_000,
    "restart_tasks": 1_000_000,
    "output_tasks": 100_000,
}
QUICK = {
    "runs": 1,
    "true_tasks": 2_000,
    "true_counts": [500, 1_000],
    "peer_tasks": 1_000,
    "noop_workers": 2,
    "noop_counts": [1_000, 10_000, 100_000],
    "noop_tune_slots": [64, 1024],
    "efficiency": [[0.01, 200], [0.1, 20], [1.0, 2]],
    "mem_array": 1_000_000,
    "mem_each": 10_000,
    "scale_workers": 20,
    "scale_tasks": 100_000,
    "scale_tune_slots": [16, 256],
    "journal_noop": 100_000,
    "journal_true": 2_000,
    "restart_tasks": 100_000,
    "output_tasks": 2_000,
}

T0 = time.monotonic()


def log(msg: str) -> None:
    el = time.monotonic() - T0
    print(f"[bench {int(el // 60):3d}:{el % 60:04.1f}] {msg}", file=sys.stderr, flush=True)
