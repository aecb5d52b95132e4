"""Figures from repeated samples: median, min and max."""

from __future__ import annotations

import statistics


def summary(samples: list[dict], key: str = "rate") -> dict:
    vals = [s[key] for s in samples if key in s]
    if not vals:
        return {}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def measured(samples: list[dict], **extra) -> dict:
    """A figure: its raw samples and the median/min/max of rate and seconds."""
    ok = [s for s in samples if "error" not in s]
    d = {"samples": samples, "rate": summary(ok, "rate"), "seconds": summary(ok, "seconds")}
    d["errors"] = [s["error"] for s in samples if "error" in s]
    d.update(extra)
    return d


def med(fig: dict | None, key: str = "rate") -> float | None:
    if not fig:
        return None
    return (fig.get(key) or {}).get("median")
