"""``python -m kestrel ...`` and the ``kestrel`` script: the whole ``kestrel`` command, from
this package's native module."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with(spec: str) -> None:
    """``KESTREL_DIE_WITH=PID:TERM|KILL`` (set by :class:`kestrel.LocalCluster`): this process
    gets that signal when its parent, process PID, dies, and ends at once if it died already."""
    pid, _, name = spec.partition(":")
    sig = signal.SIGKILL if name == "KILL" else signal.SIGTERM
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
    if pid.isdigit() and os.getppid() != int(pid):
        os._exit(1)


def _own_script() -> str | None:
    """This package's ``kestrel`` script, for the processes the command starts of itself (the
    workers of allocation queues): this process is an interpreter, not a ``kestrel`` binary."""
    script = Path(sys.executable).with_name("kestrel")
    if script.is_file() and os.access(script, os.X_OK):
        return str(script)
    return shutil.which("kestrel")


def main() -> None:
    """Runs the ``kestrel`` command with this process's arguments and exits with its status."""
    from ._native import main as native_main

    # Read and removed, so that what this process starts (tasks) does not inherit it.
    spec = os.environ.pop("KESTREL_DIE_WITH", None)
    if spec:
        _die_with(spec)
    if "KESTREL_EXE" not in os.environ and (script := _own_script()):
        os.environ["KESTREL_EXE"] = script
    # The command handles its own signals (a server and a worker stop cleanly on SIGINT and
    # SIGTERM); Python's KeyboardInterrupt would only come once it returned.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(native_main(["kestrel", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
