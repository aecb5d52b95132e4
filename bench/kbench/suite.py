"""The benchmark suite: every scenario, one method `scenario_<name>` each."""

from __future__ import annotations

from kbench.dispatch import DispatchScenarios
from kbench.journal import JournalScenarios
from kbench.memory import MemoryScenarios
from kbench.output import OutputScenarios
from kbench.spawning import SpawningScenarios


class Suite(
    SpawningScenarios, DispatchScenarios, MemoryScenarios, JournalScenarios, OutputScenarios
):
    """Runs the scenarios; `res` collects their results by scenario name."""
