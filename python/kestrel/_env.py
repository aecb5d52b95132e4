"""What a function needs of the Python that runs it: the client's fingerprint.

The runner on the worker compares it with its own before it unpickles anything (see
``_runner.py``): another Python minor version, another cloudpickle, or another version of a
module the function uses fails the task with one message naming both sides.
"""

from __future__ import annotations

import os
import platform
import sys
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

# Modules whose versions do not decide whether a pickle loads.
_IGNORED = {"builtins", "__main__", "kestrel", "cloudpickle"}


def _version_of(module: types.ModuleType) -> str | None:
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else None


def modules_of(func: Callable[..., Any]) -> list[tuple[str, str]]:
    """The top-level modules with a version that `func` names: its own module's package and
    the modules among its globals, as (name, version)."""
    names: set[str] = set()
    module = getattr(func, "__module__", None)
    if isinstance(module, str):
        names.add(module.split(".")[0])
    code = getattr(func, "__code__", None)
    globs = getattr(func, "__globals__", None)
    if code is not None and isinstance(globs, dict):
        for name in code.co_names:
            value = globs.get(name)
            if isinstance(value, types.ModuleType):
                names.add(value.__name__.split(".")[0])
            elif value is not None and hasattr(value, "__module__"):
                owner = getattr(value, "__module__", None)
                if isinstance(owner, str):
                    names.add(owner.split(".")[0])
    found = []
    for name in sorted(names - _IGNORED):
        mod = sys.modules.get(name)
        if mod is None or name in sys.stdlib_module_names:
            continue
        version = _version_of(mod)
        if version:
            found.append((name, version))
    return found


def search_path() -> list[str]:
    """The client's own entries of ``sys.path`` (its working directory and the project's
    folders, not the interpreter's), so that functions pickled by reference import on a
    worker of the same machine or file system."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    path = [os.getcwd()]
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        entry = os.path.abspath(entry)
        if any(entry.startswith(p) for p in prefixes) or entry in path:
            continue
        path.append(entry)
    return path


def fingerprint() -> dict[str, str]:
    """This interpreter's Python and cloudpickle versions."""
    return {"python": platform.python_version(), "cloudpickle": cloudpickle.__version__}
