"""``python -m kestrel ...`` and the ``kestrel`` script: the whole ``kestrel`` command, from
this package's native module."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    """Runs the ``kestrel`` command with this process's arguments and exits with its status."""
    from ._native import main as native_main

    # The command handles its own signals (a server and a worker stop cleanly on SIGINT and
    # SIGTERM); Python's KeyboardInterrupt would only come once it returned.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(native_main(["kestrel", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
