"""The client: futures for function calls and command lines on a Kestrel server.

A :class:`Client` holds one connection. It watches every job it submits: the server pushes
each task's end (with a function's pickled result) as soon as the journal holds it, and a
dispatcher thread resolves the task's :class:`Future`. Nothing polls.

Results and arguments larger than the inline limit are values kept in the workers' caches
(:mod:`kestrel._values`): a future holds such a result by name until it is asked for, calls
that take it as an argument read it on their workers, and it is deleted when its future is
dropped.

Every future resolves. A task lost with its worker is run again by the server; a task that
ends in any other way than success raises a typed error (:mod:`kestrel.errors`); a lost
connection fails every future still waiting with :class:`~kestrel.errors.ConnectionLost`.
"""

from __future__ import annotations

import base64
import concurrent.futures
import copy
import itertools
import os
import pickle
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Self

from . import _env, _pickling, _values
from ._native import (
    DEFAULT_INLINE_LIMIT,
    JOB_OPTIONS,
    ConnectionLost,
    KestrelError,
    NoServer,
    ServerError,
    Session,
    ValueLost,
)
from .errors import (
    DependencyFailed,
    EnvironmentMismatch,
    JobForgotten,
    RemoteTraceback,
    TaskCanceled,
    TaskFailed,
)

__all__ = ["Client", "CommandResult", "Future", "MapFutures", "default_client"]

# The job options `submit` and `map` take as keyword arguments (the others go to the
# function), as Dask's `Client.submit` reserves its own.
OPTIONS: tuple[str, ...] = tuple(JOB_OPTIONS)

# Bytes of lines per message of a map (the server's frames hold far more; this keeps each
# message quick to build and send while results stream back).
_PIECE_BYTES = 1 << 20
# Items per message of a map, at most.
_PIECE_ITEMS = 20_000
# Items a map keeps submitted ahead of the one its consumer reads, at most: what bounds the
# client's memory for a generator of any length.
_WINDOW = 50_000
# With more futures than this waiting, the dispatcher lets ends gather for _GATHER_S after a
# batch of fewer than _GATHER_BELOW of them: each batch wakes this thread and the threads
# waiting on its futures, and thread switches were half the client's CPU time for a stream
# of short tasks (/bin/true from Python: 102 µs of client CPU a task, 54 µs gathered; 91% of
# the CLI's rate, 98% gathered). A lone call's end (what submit→result measures) never waits.
_BUSY = 256
_GATHER_BELOW = 64
_GATHER_S = 0.003

_default: Client | None = None


def default_client() -> Client:
    """The client made last (what :func:`kestrel.task` functions submit to)."""
    if _default is None or _default.closed:
        raise KestrelError(
            "no kestrel.Client is open: make one first, e.g. "
            "`client = kestrel.Client(kestrel.LocalCluster())`"
        )
    return _default


class CommandResult:
    """What a command task that exited 0 left: its kept stdout and stderr (the first 64 KiB
    of each by default)."""

    __slots__ = ("job", "stderr", "stdout", "task", "worker")

    def __init__(self, job: int, task: int, worker: str | None, stdout: bytes, stderr: bytes):
        self.job = job
        self.task = task
        self.worker = worker
        self.stdout = stdout
        self.stderr = stderr

    @property
    def returncode(self) -> int:
        """Always 0: a command that exits otherwise raises :class:`TaskFailed`."""
        return 0

    def __repr__(self) -> str:
        return f"CommandResult(task {self.job}:{self.task}, stdout={self.stdout[:60]!r})"


class Future(concurrent.futures.Future):
    """The result of one task: a :class:`concurrent.futures.Future`, so
    :func:`concurrent.futures.wait`, :func:`~concurrent.futures.as_completed` and callbacks
    work with it, and so do :func:`kestrel.wait` and :func:`kestrel.as_completed`.

    Given as an argument to another call, it is that call's dependency: the call runs once
    this future has its value, with the value in its place. A value larger than the client's
    inline limit stays on the worker that computed it: :meth:`result` fetches it from there
    (once), a call given the future reads it where it is, and it is deleted from the
    workers' caches when the future is dropped.
    """

    def __init__(self, client: Client, kind: str, single: bool) -> None:
        super().__init__()
        self._client = client
        self._kind = kind
        # The task's job holds this task alone: canceling the future cancels the job.
        self._single = single
        self.job: int | None = None
        self.task: int | None = None
        # Its value, when a worker's cache keeps it (see kestrel._values).
        self._remote: _values.Remote | None = None
        # The futures whose values this call reads, kept (and so their values) until it ends.
        self._keep: list[Future] | None = None
        self._fetching = threading.Lock()

    def result(self, timeout: float | None = None) -> Any:
        """The call's value (fetched from the worker that keeps it, the first time, if it
        was larger than the inline limit); raises what the call raised."""
        value = super().result(timeout)
        if type(value) is _values.Remote:
            return self._fetch()
        return value

    def _fetch(self) -> Any:
        with self._fetching:
            value = self._result
            if type(value) is _values.Remote:
                value = self._client._fetch_value(self, value)
                self._result = value
            return value

    @property
    def nbytes(self) -> int | None:
        """The size of its pickled value if a worker's cache keeps it, else None."""
        return None if self._remote is None else self._remote.size

    def __reduce__(self) -> Any:
        raise TypeError(
            "a kestrel.Future is a dependency only as an argument of its own: pass it to "
            "submit directly, not inside a list, dict or other object (or pass its .result())"
        )

    @property
    def key(self) -> str | None:
        """``JOB:TASK`` on the server (what ``kestrel task info`` takes), once submitted."""
        return None if self.job is None else f"{self.job}:{self.task}"

    def cancel(self) -> bool:
        """Cancels the call if it has not ended: it resolves as canceled at once, and the
        server stops its task (one task of a map by itself, the others going on)."""
        if not super().cancel():
            return False
        if self.job is not None:
            if self._single:
                self._client._cancel_jobs([self.job])
            else:
                # Sent by the dispatcher, with the others canceled meanwhile.
                self._client._canceled_tasks.append((self.job, self.task))
        return True

    def __repr__(self) -> str:
        where = f" task {self.key}" if self.job is not None else ""
        # As concurrent.futures says it: a future that ended with an error says which.
        raised = f" raised {type(self._exception).__name__}" if self._exception else ""
        return f"<kestrel.Future{where} {self._state.lower()}{raised}>"


def _settle(future: Future, value: Any = None, error: BaseException | None = None) -> None:
    """Resolves a future unless it was canceled meanwhile (that one stays canceled)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass


def _has_future(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(a, Future) for a in itertools.chain(args, kwargs.values()))


def _pickle_call(args: tuple, kwargs: dict, limit: int = 0) -> str | None:
    """A call's arguments as a task's line: base64 of the pickled ``(args, kwargs)``; None if
    the pickle is larger than `limit` (such a call goes as a value of its own)."""
    data, _ = _values.dumps_call(args, kwargs, False)
    if limit and len(data) > limit:
        return None
    return base64.b64encode(data).decode()


def _value_gone(client: weakref.ref, job: int | None, name: str) -> None:
    """A future holding value `name` was dropped (called by the garbage collector, on any
    thread, maybe while that thread holds the client's lock: it only queues the news, for
    the dispatcher)."""
    c = client()
    if c is not None:
        c._gone_values.append((job, name))


def _function_spec(func: Callable[..., Any], inline_limit: int) -> dict[str, Any]:
    """What the server and the runners need of `func`: fails here, at submit, if it cannot
    be pickled."""
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    pickled = _pickling.dumps(func)
    env = _env.fingerprint()
    return {
        "name": name,
        "pickled": pickled,
        "python": env["python"],
        "cloudpickle": env["cloudpickle"],
        "modules": _env.modules_of(func),
        "path": _env.search_path(),
        "inline_limit": inline_limit,
    }


def _submission(submit: Callable[..., int], *args: Any) -> int:
    """Calls a session's submit, raising the server's refusal of a function no connected
    worker's Python can run as :class:`EnvironmentMismatch`, and of a call reading a value no
    worker holds any more as :class:`ValueLost`."""
    try:
        return submit(*args)
    except ServerError as e:
        if "cannot run on any connected worker" in str(e):
            raise EnvironmentMismatch(str(e)) from None
        if "which no worker holds any more" in str(e):
            raise ValueLost(str(e)) from None
        raise


def _split_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Takes the job options out of `kwargs` (the rest are the call's)."""
    return {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}


def _access_file(server_dir: str | os.PathLike[str] | None, access: str | None) -> Path:
    if access:
        return Path(access)
    if server_dir is None:
        server_dir = os.environ.get("KESTREL_SERVER_DIR") or Path.home() / ".kestrel" / "server"
    return Path(server_dir) / "access.json"


class Client:
    """A connection to a Kestrel server, for futures.

    ``Client(cluster)`` connects to a :class:`kestrel.LocalCluster`;
    ``Client(server_dir=DIR)`` or ``Client(access=FILE)`` to a server already running (its
    directory's ``access.json``: one started with ``kestrel server start``, whose workers may
    come from allocation queues); ``Client()`` to the one in ``$KESTREL_SERVER_DIR`` or
    ``~/.kestrel/server``.

    Jobs whose futures have all resolved are forgotten on the server (their results are in
    the futures); ``keep_jobs=True`` keeps them for ``kestrel job list``.

    A lost connection is made again for ``reconnect`` seconds (by default 300, and 0 for a
    :class:`LocalCluster` without a journal, whose server does not come back): a server with
    a journal that is restarted meanwhile keeps every future going, and the ends it recorded
    while the client was away arrive then. A call made while the connection is down waits for
    it (a submission is sent again under its own key, never run twice); past the window, it
    and every waiting future raise :class:`~kestrel.errors.ConnectionLost`.
    """

    def __init__(
        self,
        cluster: Any = None,
        *,
        server_dir: str | os.PathLike[str] | None = None,
        access: str | None = None,
        keep_jobs: bool = False,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        reconnect: float | None = None,
    ) -> None:
        global _default
        path = (
            Path(cluster.access_file) if cluster is not None else _access_file(server_dir, access)
        )
        if not path.exists():
            raise NoServer(
                f"no Kestrel server at {path} (its access file is missing): start one with "
                f"`kestrel server start --dir {path.parent}` and a worker with "
                f"`kestrel worker start --dir {path.parent} --python {sys.executable}`, "
                "or use kestrel.Client(kestrel.LocalCluster())"
            )
        self.cluster = cluster
        self.access_file = path
        self.keep_jobs = keep_jobs
        self.inline_limit = inline_limit
        if reconnect is None:
            durable = cluster is None or getattr(cluster, "journal", True)
            reconnect = 300.0 if durable else 0.0
        self._session = Session(str(path), reconnect)
        self._lock = threading.Lock()
        # Futures not yet resolved, by (job, task).
        self._futures: dict[tuple[int, int], Future] = {}
        # Ends that came before their future was registered (a task quicker than the reply
        # to its submission).
        self._early: dict[tuple[int, int], tuple] = {}
        # Job -> [futures of it not yet resolved, whether the job is complete (closed), how
        # many of its tasks have futures, values of it that futures hold].
        self._jobs: dict[int, list] = {}
        self._forget: list[int] = []
        # Values held by futures, name -> job (None for a scattered one).
        self._live_values: dict[str, int | None] = {}
        # Values whose futures were dropped, (job, name), for the dispatcher to let go of.
        self._gone_values: deque[tuple[int | None, str]] = deque()
        # Tasks of maps whose futures were canceled, (job, task), for the dispatcher to cancel.
        self._canceled_tasks: deque[tuple[int, int]] = deque()
        self._lost: str | None = None
        self.closed = False
        self._session.watch([], True)
        self._dispatcher = threading.Thread(
            target=self._dispatch, name="kestrel-dispatcher", daemon=True
        )
        self._dispatcher.start()
        _default = self

    # ----- submitting ---------------------------------------------------------------------

    def submit(self, func: Callable[..., Any] | list[str], *args: Any, **kwargs: Any) -> Future:
        """Runs ``func(*args, **kwargs)`` on a worker, or the command line `func` (a list of
        strings), and returns its future.

        Keyword arguments named like job options (``retries``, ``timeout`` in seconds,
        ``cpus``, ``mem`` in bytes, ``inputs`` and ``outputs`` (names in the store),
        ``store`` (a directory or URL, if the server has none), ``after``, ``env``, ``cwd``,
        ``priority``, ``name``) are options, not the function's, as in Dask.
        Futures among the arguments are dependencies: the call runs with their values.
        """
        options = _split_options(kwargs)
        self._check_open()
        if isinstance(func, (list, tuple)):
            if args or kwargs:
                raise TypeError(
                    "a command line takes no arguments besides job options: put them in the list"
                )
            argv = [os.fspath(a) for a in func]
            return self._submit_now("command", argv, options)
        if not callable(func):
            raise TypeError(
                f"submit takes a function or a command line (a list of strings), not {type(func).__name__}"
            )
        spec = _function_spec(func, self.inline_limit)
        if _has_future(args, kwargs):
            return self._submit_after(spec, args, kwargs, options)
        future = Future(self, "function", single=True)
        self._send_call(future, spec, args, kwargs, options, remote=False)
        return future

    def _submit_now(self, kind: str, what: Any, options: dict[str, Any]) -> Future:
        future = Future(self, kind, single=True)
        name = options.pop("name", None) or os.path.basename(what[0])
        job = self._session.submit_commands(name, [what], False, options)
        self._register(job, [future], closed=True, first=0)
        return future

    def _send_call(
        self,
        future: Future,
        spec: dict,
        args: tuple,
        kwargs: dict,
        options: dict,
        remote: bool,
    ) -> None:
        """Submits one call as a job of its own for `future`: its pickle inline, or put on a
        worker first if it is larger than the inline limit; `remote` says some argument is
        a value kept on a worker, which its task reads there."""
        line, values = _values.encode_call(
            args, kwargs, remote, self.inline_limit, self._session.place_value
        )
        try:
            job = _submission(self._session.submit_function, spec, [line], False, options, values)
        except BaseException:
            # A call put on a worker for a job that never was is nobody's.
            own = [v for v in values if v.startswith(_values.PREFIX + "a/")]
            if own:
                self._gone_values.extend((None, v) for v in own)
            raise
        self._register(job, [future], closed=True, first=0)

    def _call_of_its_own(self, spec: dict, args: tuple, options: dict) -> Future:
        """A call of a map that goes as a job of its own (see :meth:`MapFutures._fill`)."""
        options = dict(options)
        if _has_future(args, {}):
            return self._submit_after(spec, tuple(args), {}, options)
        future = Future(self, "function", single=True)
        self._send_call(future, spec, tuple(args), {}, options, remote=False)
        return future

    def _submit_after(self, spec: dict, args: tuple, kwargs: dict, options: dict) -> Future:
        """A call that waits for the futures among its arguments, then is submitted with
        their values (here, by the dispatcher that resolved the last one): each value inline,
        or, if a worker keeps it, by name (its task reads it on its worker)."""
        future = Future(self, "function", single=True)
        deps = [a for a in itertools.chain(args, kwargs.values()) if isinstance(a, Future)]
        # Their values stay on their workers while this call may read them.
        future._keep = deps
        left = [len(deps)]
        guard = threading.Lock()

        def one_done(_: concurrent.futures.Future) -> None:
            with guard:
                left[0] -= 1
                if left[0]:
                    return
            if future.done():
                return
            failed = next((d for d in deps if d.cancelled() or d.exception() is not None), None)
            if failed is not None:
                cause = (
                    concurrent.futures.CancelledError()
                    if failed.cancelled()
                    else failed.exception()
                )
                error = DependencyFailed(
                    f"not run: its argument {failed!r} failed ({type(cause).__name__}: {cause})"
                )
                error.__cause__ = cause
                _settle(future, error=error)
                return

            remote = any(isinstance(d, Future) and d._remote is not None for d in deps)

            def value(a: Any) -> Any:
                if not isinstance(a, Future):
                    return a
                # A value a worker keeps is read there, fetched here or not.
                return a._remote if a._remote is not None else a.result()

            real_args = tuple(value(a) for a in args)
            real_kwargs = {k: value(v) for k, v in kwargs.items()}
            try:
                self._send_call(future, spec, real_args, real_kwargs, dict(options), remote)
            except BaseException as e:  # the future carries any failure to submit
                future._keep = None
                _settle(future, error=e)

        for d in deps:
            d.add_done_callback(one_done)
        return future

    def map(
        self, func: Callable[..., Any], *iterables: Iterable[Any], **options: Any
    ) -> MapFutures:
        """Calls `func` on each item of the iterables (zipped, as the builtin :func:`map`)
        and returns their futures in order, as a :class:`MapFutures`.

        One job holds every call, and the function travels once per worker. The iterables
        may be generators of any length: items are read and submitted as the futures are
        consumed, at most some tens of thousands ahead, so the client's memory stays bounded.
        How many calls go per message is Kestrel's choice.
        """
        self._check_open()
        if not iterables:
            raise TypeError("map needs at least one iterable")
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise TypeError(
                f"unknown options {sorted(unknown)}; the options are {', '.join(OPTIONS)}"
            )
        spec = _function_spec(func, self.inline_limit)
        return MapFutures(self, spec, zip(*iterables), options, _sized(iterables))

    def map_commands(self, commands: Iterable[list[str]], **options: Any) -> MapFutures:
        """Runs each command line of `commands` (lists of strings) as a task of one job,
        and returns their futures in order (each resolves to a :class:`CommandResult`), as
        :meth:`map` does for a function: streamed from any iterable, a bounded window ahead.

        ``name`` names the job (by default, the first command's program).
        """
        self._check_open()
        unknown = set(options) - set(OPTIONS)
        if unknown:
            raise TypeError(
                f"unknown options {sorted(unknown)}; the options are {', '.join(OPTIONS)}"
            )
        size = _sized((commands,))
        argvs = ([os.fspath(a) for a in _argv(c)] for c in commands)
        return MapFutures(self, None, argvs, options, size)

    def gather(self, futures: Iterable[Future], timeout: float | None = None) -> list[Any]:
        """The results of `futures`, in order; raises the first error met."""
        return [f.result(timeout) for f in futures]

    def scatter(self, value: Any) -> Future:
        """Puts `value` on a worker and returns a future holding it there: give the future
        to any number of calls (``submit`` or ``map``) and each reads the value on its worker,
        copied worker to worker as needed, instead of sending it with every call. The value
        is deleted from the workers' caches when the future is dropped."""
        self._check_open()
        data = _values.dumps_value(value)
        name = _values.new_name("s")
        self._session.place_value(name, data)
        future = Future(self, "function", single=False)
        remote = _values.Remote(name, len(data))
        future._remote = remote
        with self._lock:
            self._live_values[name] = None
        weakref.finalize(future, _value_gone, weakref.ref(self), None, name)
        _settle(future, remote)
        return future

    def _fetch_value(self, future: Future, remote: _values.Remote) -> Any:
        """The value a worker keeps as `remote` (`future`'s), fetched from it. A result lost
        with its worker is made again (its task runs again, as for a call that reads it)."""
        if self.closed:
            raise KestrelError(
                f"this client is closed, and the value it left on a worker ({remote.size} "
                "bytes) was deleted with it: ask for results before closing the client"
            )
        try:
            data = self._session.fetch_value(remote.name, remote.size)
        except ValueLost:
            if future.job is None:
                raise  # A scattered value: nothing can make it again.
            # A call that reads it makes the server run its task again first; its copy of
            # the value is this one's.
            return self.submit(copy.copy, future).result()
        return pickle.loads(data)

    # ----- the server's side ---------------------------------------------------------------

    def workers(self) -> list[dict[str, Any]]:
        """The connected workers."""
        return self._session.workers()

    def server_info(self) -> dict[str, Any]:
        """The server's version, address, directory and counts."""
        return self._session.server_info()

    def _cancel_jobs(self, jobs: list[int]) -> None:
        try:
            self._session.cancel(jobs)
        except KestrelError:
            pass  # The job ended meanwhile, or the connection went: nothing left to stop.

    # ----- the futures' side ----------------------------------------------------------------

    def _register(self, job: int, futures: list[Future], closed: bool, first: int) -> None:
        """Binds futures to tasks `first`, `first + 1`, ... of `job`, resolving those whose
        ends came already."""
        ready = []
        with self._lock:
            entry = self._jobs.setdefault(job, [0, False, 0, 0])
            entry[0] += len(futures)
            entry[1] = closed
            entry[2] = max(entry[2], first + len(futures))
            for i, f in enumerate(futures, first):
                f.job, f.task = job, i
                early = self._early.pop((job, i), None) if self._early else None
                if early is not None:
                    ready.append((f, early))
                else:
                    self._futures[(job, i)] = f
            if not futures:
                self._job_settled(job, entry)
            lost = self._lost
        for f, ev in ready:
            self._resolve(f, ev)
        if lost is not None:
            self._fail_all(lost)

    def _job_settled(self, job: int, entry: list) -> None:
        """Called with the lock held: a job whose futures have all resolved, and hold none of
        its values (forgetting the job deletes them), is forgotten."""
        if entry[0] == 0 and entry[1] and entry[3] == 0:
            del self._jobs[job]
            if not self.keep_jobs:
                self._forget.append(job)

    def _dispatch(self) -> None:
        session = self._session
        while True:
            try:
                events = session.next_events(0.2)
            except BaseException:  # interpreter shutdown
                return
            for ev in events:
                kind = ev[0]
                if kind == "end":
                    key = (ev[1], ev[2])
                    with self._lock:
                        future = self._futures.pop(key, None)
                        if future is None:
                            entry = self._jobs.get(ev[1])
                            # Told again after a reconnection: its future has its value.
                            if entry is None or ev[2] >= entry[2]:
                                self._early[key] = ev
                            continue
                    self._resolve(future, ev)
                    # Not held here until the next end: a dropped future must be collected
                    # (its value deleted) at once.
                    future = None
                elif kind == "gone":
                    self._fail_job(ev[1], JobForgotten(ev[2]))
                elif kind == "reconnected":
                    self._watch_again(ev[1])
                elif kind == "lost":
                    self._fail_all(ev[1])
                    return
            self._flush_forgets()
            if len(events) < _GATHER_BELOW and len(self._futures) > _BUSY:
                time.sleep(_GATHER_S)

    def _watch_again(self, why: str) -> None:
        """After a reconnection: watches the jobs with futures waiting again (the server tells
        their ends so far at once); those it no longer has fail."""
        with self._lock:
            jobs = list(self._jobs)
        try:
            missing = self._session.watch(jobs, True)
        except KestrelError:
            return  # Lost again: the next reconnection watches them.
        for job in missing:
            self._fail_job(
                job,
                JobForgotten(
                    f"job {job} is gone: the server came back without it (no journal?) after {why}"
                ),
            )

    def _flush_forgets(self) -> None:
        drops: list[str] = []
        with self._lock:
            while self._gone_values:
                job, name = self._gone_values.popleft()
                drops.append(name)
                self._live_values.pop(name, None)
                entry = self._jobs.get(job) if job is not None else None
                if entry is not None:
                    entry[3] -= 1
                    self._job_settled(job, entry)
            jobs, self._forget = self._forget, []
        cancels: dict[int, list[int]] = {}
        while self._canceled_tasks:
            job, task = self._canceled_tasks.popleft()
            cancels.setdefault(job, []).append(task)
        # Each on its own: one refused (a job forgotten meanwhile) must not lose the others.
        calls = [(self._session.cancel_tasks, (job, tasks)) for job, tasks in cancels.items()]
        if drops:
            calls.append((self._session.drop_values, (drops,)))
        if jobs:
            calls.append((self._session.forget, (jobs,)))
        for call, args in calls:
            try:
                call(*args)
            except KestrelError:
                pass  # Housekeeping: a lost connection fails futures elsewhere.

    def _resolve(self, future: Future, ev: tuple) -> None:
        _, job, task, state, reason, worker, stdout, _total, stderr = ev
        value: Any = None
        error: BaseException | None = None
        if state == "finished":
            remote = (
                _values.parse_reference(stdout) if future._kind == "function" and stdout else None
            )
            if remote is not None:
                value = self._hold_value(future, job, remote)
            elif future._kind == "function":
                try:
                    value = pickle.loads(stdout) if stdout else None
                except Exception as e:
                    error = KestrelError(
                        f"the result of task {job}:{task} cannot be unpickled here: {e!r}"
                    )
            else:
                value = CommandResult(job, task, worker, stdout or b"", stderr or b"")
        elif state == "failed":
            error = self._failure(future, job, task, reason or "", worker, stdout, stderr)
        else:
            error = TaskCanceled(
                f"task {job}:{task} was canceled: {reason or 'its job was canceled'}"
            )
        _settle(future, value, error)
        # Its arguments' values may go now.
        future._keep = None
        with self._lock:
            entry = self._jobs.get(job)
            if entry is not None:
                entry[0] -= 1
                self._job_settled(job, entry)

    def _hold_value(self, future: Future, job: int, remote: _values.Remote) -> _values.Remote:
        """`future`'s value is kept on a worker: its job is not forgotten (which would delete
        it) until the future is dropped."""
        future._remote = remote
        with self._lock:
            entry = self._jobs.get(job)
            if entry is not None:
                entry[3] += 1
            self._live_values[remote.name] = job
        weakref.finalize(future, _value_gone, weakref.ref(self), job, remote.name)
        return remote

    @staticmethod
    def _failure(
        future: Future,
        job: int,
        task: int,
        reason: str,
        worker: str | None,
        stdout: bytes | None,
        stderr: bytes | None,
    ) -> BaseException:
        if future._kind == "function" and stdout and reason.startswith("raised"):
            try:
                error = pickle.loads(stdout)
            except Exception:
                error = None
            if isinstance(error, BaseException):
                where = f"on worker {worker}" if worker else "on its worker"
                text = (stderr or b"").decode(errors="replace")
                error.__cause__ = RemoteTraceback(
                    f"\nTask {job}:{task} raised {where}:\n\n{text.rstrip()}\n"
                )
                return error
        if "cannot run on this worker" in reason:
            return EnvironmentMismatch(reason, job=job, task=task, worker=worker, stderr=stderr)
        return TaskFailed(reason, job=job, task=task, worker=worker, stderr=stderr)

    def _fail_job(self, job: int, error: BaseException) -> None:
        with self._lock:
            keys = [k for k in self._futures if k[0] == job]
            futures = [self._futures.pop(k) for k in keys]
            self._jobs.pop(job, None)
        for f in futures:
            _settle(f, error=error)

    def _fail_all(self, why: str) -> None:
        with self._lock:
            self._lost = why
            futures = list(self._futures.values())
            self._futures.clear()
        for f in futures:
            _settle(f, error=ConnectionLost(f"{why}; this task's end was not heard"))

    def _check_open(self) -> None:
        if self.closed:
            raise KestrelError("this client is closed")
        if self._lost is not None:
            raise ConnectionLost(f"{self._lost}; make a new kestrel.Client once the server is back")

    # ----- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Closes the connection; futures still waiting fail with ConnectionLost."""
        global _default
        if self.closed:
            return
        # Not while the connection is being made again: closing does not wait for the server.
        if self._session.is_up:
            with self._lock:
                held = list(self._live_values)
                self._live_values.clear()
            # The values futures hold go with the client.
            self._gone_values.extend((None, name) for name in held)
            self._flush_forgets()
        self.closed = True
        self._session.close()
        self._dispatcher.join(5)
        self._fail_all("the client was closed")
        if _default is self:
            _default = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"connected to {self._session.address}"
        return f"<kestrel.Client {state}>"


def _argv(command: Any) -> list[str]:
    if isinstance(command, (str, bytes)) or not isinstance(command, (list, tuple)):
        raise TypeError(
            f"a command line is a list of strings, not {type(command).__name__}: {command!r:.80}"
        )
    if not command:
        raise ValueError("an empty command line: each needs at least its program")
    return list(command)


# The end of a map's input.
_END = object()


def _sized(iterables: tuple) -> int | None:
    try:
        return min(len(i) for i in iterables)
    except TypeError:
        return None


class MapFutures:
    """The futures of a :meth:`Client.map` (or :meth:`Client.map_commands`), in the order
    of its items.

    Iterate it (or pass it to :meth:`Client.gather`, :func:`kestrel.as_completed`, ``list``)
    to get them; items of the input are read and submitted as you go, a bounded window
    ahead. :meth:`results` yields the values in order; :meth:`cancel` cancels the whole map.
    """

    def __init__(
        self,
        client: Client,
        spec: dict[str, Any] | None,
        items: Iterator[Any],
        options: dict[str, Any],
        size: int | None,
    ) -> None:
        self._client = client
        # The pickled function, or None for a job of command lines (then items are argvs).
        self._spec = spec
        self._items = items
        self._options = options
        self._size = size
        self._ready: deque[Future] = deque()
        self.job: int | None = None
        # Lines sent to the job (items that went as calls of their own are not among them).
        self._sent = 0
        self._exhausted = False
        self._closed = False
        self._lock = threading.Lock()
        self._fill(_WINDOW)

    def __len__(self) -> int:
        if self._size is None:
            raise TypeError("the map's input has no length (a generator)")
        return self._size

    def _fill(self, ahead: int) -> None:
        """Submits items until `ahead` futures wait unread, or the input ends. An item that
        cannot share the map's job (a future among its arguments, or a pickle larger than the
        inline limit) goes as a call of its own, its future in its place among the others."""
        with self._lock:
            commands = self._spec is None
            limit = self._client.inline_limit
            lines: list[Any] = []
            size = 0
            while not self._exhausted and len(self._ready) + len(lines) < ahead:
                item = next(self._items, _END)
                if item is _END:
                    self._exhausted = True
                    break
                if commands:
                    lines.append(item)
                    size += sum(map(len, item))
                else:
                    line = None if _has_future(item, {}) else _pickle_call(item, {}, limit)
                    if line is None:
                        if lines:
                            self._send(lines)
                            lines, size = [], 0
                        self._ready.append(
                            self._client._call_of_its_own(self._spec, item, self._options)
                        )
                        continue
                    lines.append(line)
                    size += len(line)
                if len(lines) >= _PIECE_ITEMS or size >= _PIECE_BYTES:
                    self._send(lines)
                    lines, size = [], 0
            # The last lines, or the close of a job whose last lines went before the end
            # was seen.
            if lines or (self._exhausted and self.job is not None and not self._closed):
                self._send(lines)

    def _send(self, lines: list[Any]) -> None:
        client = self._client
        session = client._session
        kind = "command" if self._spec is None else "function"
        futures = [Future(client, kind, single=False) for _ in lines]
        close = self._exhausted
        self._closed = close
        if self.job is None:
            options = dict(self._options)
            if self._spec is None:
                name = options.pop("name", None) or os.path.basename(lines[0][0])
                self.job = session.submit_commands(name, lines, not close, options)
            else:
                self.job = _submission(
                    session.submit_function, self._spec, lines, not close, options
                )
        elif (lines or close) and self._spec is None:
            session.extend_commands(self.job, self._sent, lines, close)
        elif lines or close:
            session.extend_lines(self.job, self._sent, lines, close)
        client._register(self.job, futures, closed=close, first=self._sent)
        self._sent += len(lines)
        self._ready.extend(futures)

    def __iter__(self) -> Iterator[Future]:
        return self

    def __next__(self) -> Future:
        if len(self._ready) < _WINDOW // 2 and not self._exhausted:
            self._fill(_WINDOW)
        if not self._ready:
            raise StopIteration
        return self._ready.popleft()

    def results(self, timeout: float | None = None) -> Iterator[Any]:
        """The values, in order; raises the first error met."""
        for f in self:
            yield f.result(timeout)

    def cancel(self) -> None:
        """Cancels the map: its futures not yet resolved resolve as canceled."""
        for f in list(self._ready):
            f.cancel()
        if self.job is not None:
            self._client._cancel_jobs([self.job])

    def __repr__(self) -> str:
        return f"<kestrel.MapFutures job {self.job}, {self._sent} submitted>"
