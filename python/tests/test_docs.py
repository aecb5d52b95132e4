"""The examples of docs/python.md run, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "python.md"


def test_the_guide_runs():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 8, "the guide lost its examples"
    namespace: dict = {"__name__": "__main__"}
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"{GUIDE.name} example {i + 1}", "exec"), namespace)  # noqa: S102 -- the guide is ours
    finally:
        for name in ("client", "cluster"):
            if name in namespace:
                namespace[name].close()
