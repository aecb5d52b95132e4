"""A Kestrel server and workers on this machine, started and stopped from Python."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Self

from ._native import KestrelError, Session

__all__ = ["LocalCluster"]


def _command() -> list[str]:
    """How to run the `kestrel` command: this package's, from this interpreter."""
    return [sys.executable, "-m", "kestrel"]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _stop(processes: list[subprocess.Popen], directory: str | None, timeout: float = 10.0) -> None:
    """Stops the processes (workers first, the server last: SIGTERM, then SIGKILL after
    `timeout`) and removes `directory` if the cluster made it."""
    for p in processes:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + timeout
    for p in processes:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


class LocalCluster:
    """A server and `workers` workers of `slots` slots each on this machine, as processes of
    this interpreter (``python -m kestrel``), for :class:`kestrel.Client`.

    Function tasks run in runners of `python` (this interpreter by default), so a function
    defined here runs there with the same modules. The cluster stops when closed, when left
    as a context manager, when garbage-collected, and when the interpreter exits, also if
    it is killed (on Linux; the thread that made the cluster must outlive it).
    ``journal=True`` makes the server durable (its directory's journal); ``store`` (a
    directory or an http(s) URL prefix) is where tasks' ``inputs`` and ``outputs`` live.

    >>> with kestrel.LocalCluster(workers=2, slots=2) as cluster:   # doctest: +SKIP
    ...     client = kestrel.Client(cluster)
    """

    def __init__(
        self,
        workers: int = 1,
        slots: int | None = None,
        *,
        python: str | None = None,
        directory: str | os.PathLike[str] | None = None,
        journal: bool = False,
        store: str | os.PathLike[str] | None = None,
        heartbeat: str = "1s",
        worker_args: list[str] | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        if workers < 0:
            raise ValueError(f"workers={workers}: give 0 or more")
        if slots is not None and slots < 1:
            raise ValueError(f"slots={slots}: give 1 or more (or None for one per core)")
        self.slots = slots or os.cpu_count() or 1
        self.journal = journal
        self.python = python or sys.executable
        self._owns_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="kestrel-cluster-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.worker_args = list(worker_args or [])
        self.start_timeout = start_timeout
        self._processes: list[subprocess.Popen] = []
        self.workers: list[subprocess.Popen] = []
        self._finalizer = weakref.finalize(
            self, _stop, self._processes, str(self.directory) if self._owns_dir else None
        )
        server = [
            *_command(),
            "server",
            "start",
            "--dir",
            str(self.directory),
            "--host",
            "127.0.0.1",
            "--heartbeat",
            heartbeat,
        ]
        if not journal:
            server.append("--no-journal")
        if store is not None:
            server += ["--store", os.fspath(store)]
        # The server stops cleanly on SIGTERM; a worker is killed (its reaper then kills its
        # tasks), since one that drains would wait for them.
        self._server_argv = server
        self.server = self._spawn(server, "server.log", "TERM")
        try:
            self._wait_for_access()
            for _ in range(workers):
                self.add_worker()
            self.wait_for_workers(workers)
        except BaseException:
            self.close()
            raise

    @property
    def access_file(self) -> Path:
        """The server's access file, which clients connect with."""
        return self.directory / "access.json"

    def _spawn(self, argv: list[str], log: str, on_our_death: str) -> subprocess.Popen:
        # If this interpreter dies without cleaning up (SIGKILL, a crash), its cluster gets
        # `on_our_death` from the kernel instead of running on (`kestrel.__main__`).
        env = dict(os.environ, KESTREL_DIE_WITH=f"{os.getpid()}:{on_our_death}")
        with open(self.directory / log, "ab") as out:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                # Its own process group: a Ctrl-C in a terminal or a Jupyter interrupt reaches
                # this interpreter, not the cluster, which the interpreter then stops.
                start_new_session=True,
            )
        # Stopped in this order: workers first, the server (started first) last.
        self._processes.insert(0, p)
        return p

    def restart_server(self) -> None:
        """Kills the server with SIGKILL, as a crash would, and starts it again on the same
        directory. With ``journal=True`` it carries on where it was: finished tasks keep
        their results, the workers and the clients (within their ``reconnect`` window) come
        back by themselves, and no future is lost. The new server belongs to the calling
        thread as the first did to the cluster's: call it from one that outlives it."""
        old = self.server
        if old.poll() is None:
            old.kill()
        old.wait()
        self._processes.remove(old)
        # The new server writes its own (its port and secret may differ).
        self.access_file.unlink(missing_ok=True)
        self.server = self._spawn(self._server_argv, "server.log", "TERM")
        # Still stopped last.
        self._processes.remove(self.server)
        self._processes.append(self.server)
        self._wait_for_access()

    def _wait_for_access(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not self.access_file.exists():
            if self.server.poll() is not None:
                raise KestrelError(
                    f"the cluster's server exited with status {self.server.returncode}:\n"
                    + _tail(self.directory / "server.log")
                )
            if time.monotonic() > deadline:
                raise KestrelError(
                    f"the cluster's server did not start within {self.start_timeout} s; its log:\n"
                    + _tail(self.directory / "server.log")
                )
            time.sleep(0.01)

    def add_worker(self, slots: int | None = None, *args: str) -> subprocess.Popen:
        """Starts one more worker (of `slots` slots, the cluster's by default) and returns
        its process; it joins the server in the background."""
        n = len(self.workers)
        argv = [
            *_command(),
            "worker",
            "start",
            "--server-dir",
            str(self.directory),
            "--slots",
            str(slots or self.slots),
            "--python",
            self.python,
            *self.worker_args,
            *args,
        ]
        p = self._spawn(argv, f"worker-{n}.log", "KILL")
        self.workers.append(p)
        return p

    def wait_for_workers(self, count: int, timeout: float | None = None) -> None:
        """Waits until at least `count` workers are connected to the server."""
        if count == 0:
            return
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        session = Session(str(self.access_file))
        try:
            while len(session.workers()) < count:
                dead = [i for i, p in enumerate(self.workers) if p.poll() is not None]
                if dead:
                    i = dead[0]
                    raise KestrelError(
                        f"worker {i} of the cluster exited with status {self.workers[i].returncode}:\n"
                        + _tail(self.directory / f"worker-{i}.log")
                    )
                if time.monotonic() > deadline:
                    raise KestrelError(
                        f"{count} workers did not join within the timeout; the first one's log:\n"
                        + _tail(self.directory / "worker-0.log")
                    )
                time.sleep(0.02)
        finally:
            session.close()

    def close(self, timeout: float = 10.0) -> None:
        """Stops the workers and the server (and removes the cluster's directory if it made
        one)."""
        if self._finalizer.alive:
            self._finalizer.detach()
            _stop(self._processes, str(self.directory) if self._owns_dir else None, timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self._finalizer.alive else "closed"
        return (
            f"LocalCluster({len(self.workers)} workers x {self.slots} slots, {state}, "
            f"directory={str(self.directory)!r})"
        )
