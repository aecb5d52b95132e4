"""The errors a Kestrel future raises, and the ones the client raises itself.

Every one is a :class:`KestrelError`. A function that raised on its worker re-raises its own
exception instead, with the remote traceback attached as its ``__cause__`` (a
:class:`RemoteTraceback`, as :class:`concurrent.futures.ProcessPoolExecutor` does).
"""

from __future__ import annotations

from concurrent.futures import CancelledError

from ._native import ConnectionLost, KestrelError, NoServer, ServerError, ValueLost

__all__ = [
    "ConnectionLost",
    "DependencyFailed",
    "EnvironmentMismatch",
    "JobForgotten",
    "KestrelError",
    "NoServer",
    "RemoteTraceback",
    "ServerError",
    "TaskCanceled",
    "TaskFailed",
    "ValueLost",
]


class TaskFailed(KestrelError):
    """A task failed for a reason of its own that is not a Python exception: a command that
    exited non-zero, a runner that died (a segfault, ``os._exit``, killed for memory), a
    timeout, a result too large to carry back, a worker lost too many times."""

    def __init__(
        self,
        reason: str,
        *,
        job: int,
        task: int,
        worker: str | None = None,
        stderr: bytes | None = None,
    ) -> None:
        where = f"task {job}:{task}" + (f" on {worker}" if worker else "")
        text = f"{where} {reason}" if reason else f"{where} failed"
        tail = (stderr or b"").decode(errors="replace").strip()
        if tail:
            text += "\n--- its stderr (last lines) ---\n" + "\n".join(tail.splitlines()[-20:])
        super().__init__(text)
        self.reason = reason
        self.job = job
        self.task = task
        self.worker = worker
        self.stderr = stderr


class EnvironmentMismatch(TaskFailed):
    """The worker's Python cannot run the client's pickles: another Python or cloudpickle
    version, or a module the function uses missing or at another version there. The message
    names both sides; start the worker with ``--python PATH`` naming a matching
    interpreter.

    Raised by ``submit`` and ``map`` themselves (``job`` and ``task`` None) when no connected
    worker has the client's Python and cloudpickle, and by a task's future when its runner
    finds a module of another version."""

    def __init__(
        self,
        reason: str,
        *,
        job: int | None = None,
        task: int | None = None,
        worker: str | None = None,
        stderr: bytes | None = None,
    ) -> None:
        if job is None or task is None:
            KestrelError.__init__(self, reason)
            self.reason, self.job, self.task, self.worker, self.stderr = (
                reason,
                job,
                task,
                worker,
                stderr,
            )
        else:
            super().__init__(reason, job=job, task=task, worker=worker, stderr=stderr)


class TaskCanceled(KestrelError, CancelledError):
    """The task was canceled on the server (``kestrel job cancel``, or what it depended on
    failed) rather than by this future's :meth:`~concurrent.futures.Future.cancel`."""


class JobForgotten(KestrelError):
    """The task's job was forgotten on the server (``kestrel job forget``) before it ended."""


class DependencyFailed(KestrelError):
    """A future given as an argument failed, so this call never ran; its error is
    ``__cause__``."""


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a worker, as text."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text
