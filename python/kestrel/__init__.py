"""Kestrel from Python: futures for function calls and command lines, ``map`` over inputs
of any length, and a drop-in :class:`concurrent.futures.Executor`.

>>> import kestrel                                                   # doctest: +SKIP
>>> with kestrel.LocalCluster(workers=1, slots=2) as cluster:
...     with kestrel.Client(cluster) as client:
...         client.submit(pow, 2, 10).result()
1024

The guide is ``docs/python.md`` in the repository.
"""

from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, FIRST_EXCEPTION, as_completed, wait

from ._native import __version__
from .client import Client, CommandResult, Future, MapFutures, default_client
from .cluster import LocalCluster
from .errors import (
    ConnectionLost,
    DependencyFailed,
    EnvironmentMismatch,
    JobForgotten,
    KestrelError,
    NoServer,
    RemoteTraceback,
    ServerError,
    TaskCanceled,
    TaskFailed,
    ValueLost,
)
from .executor import Executor, task
from .progress import progress

__all__ = [
    "ALL_COMPLETED",
    "FIRST_COMPLETED",
    "FIRST_EXCEPTION",
    "Client",
    "CommandResult",
    "ConnectionLost",
    "DependencyFailed",
    "EnvironmentMismatch",
    "Executor",
    "Future",
    "JobForgotten",
    "KestrelError",
    "LocalCluster",
    "MapFutures",
    "NoServer",
    "RemoteTraceback",
    "ServerError",
    "TaskCanceled",
    "TaskFailed",
    "ValueLost",
    "__version__",
    "as_completed",
    "default_client",
    "progress",
    "task",
    "wait",
]
