"""`kestrel.Executor`, a drop-in :class:`concurrent.futures.Executor`, and `@kestrel.task`."""

from __future__ import annotations

import concurrent.futures
import functools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from .client import Client, Future, default_client
from .cluster import LocalCluster

__all__ = ["Executor", "task"]

T = TypeVar("T")


class Executor(concurrent.futures.Executor):
    """Runs calls on Kestrel workers where code uses a
    :class:`~concurrent.futures.ProcessPoolExecutor`::

        with kestrel.Executor(max_workers=4) as ex:
            squares = list(ex.map(pow, range(10), itertools.repeat(2)))

    With no `client`, it starts a :class:`LocalCluster` of one worker with `max_workers`
    slots (one per core by default) and stops it at shutdown; give ``client=`` (or
    ``server_dir=`` / ``access=``) to run on a cluster instead. Unlike
    :meth:`Client.submit`, every keyword argument of :meth:`submit` goes to the function, as
    the standard library's executors do; job options (``retries=``, ``timeout=``, ...) are
    the Executor's own, for every call.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        *,
        client: Client | None = None,
        server_dir: str | os.PathLike[str] | None = None,
        access: str | None = None,
        **options: Any,
    ) -> None:
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        self._cluster: LocalCluster | None = None
        if client is None and server_dir is None and access is None:
            self._cluster = LocalCluster(workers=1, slots=max_workers)
            client = Client(self._cluster)
            self._owns_client = True
        elif client is None:
            client = Client(server_dir=server_dir, access=access)
            self._owns_client = True
        else:
            self._owns_client = False
        self.client = client
        self._options = options
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        return _submit_exact(self.client, fn, args, kwargs, self._options)

    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[T]:
        """Like :meth:`concurrent.futures.Executor.map`: the results in order, lazily; the
        input may be a generator of any length. `chunksize` is accepted and ignored: Kestrel
        sends calls in pieces of its own choosing and runs each in a warm runner."""
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        deadline = None if timeout is None else time.monotonic() + timeout
        futures = self.client.map(fn, *iterables, **self._options)

        def results() -> Iterator[T]:
            for f in futures:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    yield f.result(left)
                except concurrent.futures.TimeoutError:
                    futures.cancel()
                    raise

        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        if cancel_futures:
            with self.client._lock:
                pending = list(self.client._futures.values())
            for f in pending:
                f.cancel()
        if wait:
            with self.client._lock:
                pending = list(self.client._futures.values())
            concurrent.futures.wait(pending)
        if self._owns_client:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def _clash(kwargs: dict[str, Any]) -> bool:
    from .client import OPTIONS

    return any(k in OPTIONS for k in kwargs)


def _submit_exact(
    client: Client, fn: Callable[..., Any], args: tuple, kwargs: dict, options: dict
) -> Future:
    """Submits ``fn(*args, **kwargs)`` with every keyword argument the function's. One named
    like a job option goes through a wrapper that hands it back (the wrapper is pickled by
    reference: the worker's Python needs this package)."""
    if _clash(kwargs):
        return client.submit(_call_with, fn, args, kwargs, **options)
    return client.submit(fn, *args, **kwargs, **options)


def _call_with(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    return fn(*args, **kwargs)


class _Task:
    """A function whose calls return futures (see :func:`task`)."""

    def __init__(self, fn: Callable[..., Any], client: Client | None, options: dict[str, Any]):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.client = client
        self.options = options

    def __call__(self, *args: Any, **kwargs: Any) -> Future:
        client = self.client or default_client()
        return _submit_exact(client, self.fn, args, kwargs, self.options)

    def local(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the function here, now."""
        return self.fn(*args, **kwargs)

    def map(self, *iterables: Iterable[Any]) -> Any:
        """:meth:`Client.map` of the function, with its options."""
        client = self.client or default_client()
        return client.map(self.fn, *iterables, **self.options)


def task(
    fn: Callable[..., Any] | None = None, *, client: Client | None = None, **options: Any
) -> Any:
    """Makes a function return a :class:`Future` when called: ``@kestrel.task`` or
    ``@kestrel.task(cpus=2, retries=1)``. Calls go to `client`, else to the client made
    last; ``f.local(...)`` calls it here, ``f.map(...)`` maps it."""
    if fn is None:
        return lambda f: _Task(f, client, options)
    return _Task(fn, client, options)
