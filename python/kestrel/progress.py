"""A progress bar over futures (tqdm's: a text bar in a terminal, a widget in Jupyter)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable
from typing import Any


def progress(futures: Iterable[Any], *, total: int | None = None, desc: str = "tasks") -> list[Any]:
    """Shows a bar that advances as `futures` resolve, and returns them (a list) once all
    have. Needs tqdm (``pip install tqdm``, or ``pip install ./python[progress]``)."""
    try:
        from tqdm.auto import tqdm
    except ImportError as e:
        raise ImportError(
            "kestrel.progress draws with tqdm, which is not installed: `pip install tqdm`"
        ) from e
    futures = list(futures)
    with tqdm(total=total or len(futures), desc=desc, unit="task") as bar:
        for _ in concurrent.futures.as_completed(futures):
            bar.update(1)
    return futures
