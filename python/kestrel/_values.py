"""Values: results and arguments too large to travel inline, kept in the workers' caches.

A result larger than the client's ``inline_limit`` stays on the worker that computed it; the
task's end carries a reference (:func:`parse_reference`), and the future holds a
:class:`Remote` until its value is asked for, when it is fetched from that worker (never
through the server). A call given such a future as an argument reads the value where it is:
its pickle refers to the value by a persistent id, and the value is staged on the call's
worker like an input file, from the worker that holds it. A call whose own pickle is larger
than the limit is put on a worker before its job is submitted, and its line names it
(``@NAME``).

Names (``kestrel-values/r/...`` for results, ``a/`` for arguments, ``s/`` for scattered
values) are the server's; see ``kestrel_core::values``.
"""

from __future__ import annotations

import base64
import io
import pickle
import secrets
from typing import Any

from . import _pickling

# The first bytes of a task's end that refers to a value instead of carrying one.
_MAGIC = b"\0kestrel-value\0"
PREFIX = "kestrel-values/"


class Remote:
    """A value kept in a worker's cache, by name, with its size in bytes."""

    __slots__ = ("name", "size")

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size

    def __repr__(self) -> str:
        return f"<value {self.name}, {self.size} bytes>"


def parse_reference(data: bytes) -> Remote | None:
    """The value a task's end refers to, if it refers to one rather than carries a pickle."""
    if not data.startswith(_MAGIC):
        return None
    size, _, name = data[len(_MAGIC) :].decode().partition("\n")
    return Remote(name, int(size))


def new_name(kind: str) -> str:
    """A fresh name for a value the client puts on a worker: ``a`` (a call's own) or ``s``
    (scattered)."""
    return f"{PREFIX}{kind}/{secrets.token_hex(16)}"


class _Refs:
    """Pickles :class:`Remote` values as persistent ids, noting their names (mixed into a
    pickler)."""

    names: list[str]

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is Remote:
            self.names.append(obj.name)
            return ("kestrel-value", obj.name)
        return None


class _RefPickler(_Refs, pickle.Pickler):
    def __init__(self, file: io.BytesIO, names: list[str]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.names = names


class _CloudRefPickler(_Refs, _pickling._Pickler):
    """For what only cloudpickle pickles (lambdas, local classes)."""

    def __init__(self, file: io.BytesIO, names: list[str]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.names = names


def dumps_value(value: Any) -> bytes:
    """`value` pickled plainly if it can be, else by cloudpickle (a lambda, a local class)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return _pickling.dumps(value)


def dumps_call(args: tuple, kwargs: dict, remote: bool) -> tuple[bytes, list[str]]:
    """A call's pickled ``(args, kwargs)`` and the values it refers to. `remote` says some
    argument is a :class:`Remote` (the plain, faster pickler serves the others)."""
    if not remote:
        return dumps_value((args, kwargs)), []
    for pickler in (_RefPickler, _CloudRefPickler):
        names: list[str] = []
        out = io.BytesIO()
        try:
            pickler(out, names).dump((args, kwargs))
        except Exception:
            if pickler is _CloudRefPickler:
                raise
            continue
        return out.getvalue(), sorted(set(names))
    raise AssertionError("unreachable")


def encode_call(
    args: tuple, kwargs: dict, remote: bool, limit: int, place: Any
) -> tuple[str, list[str]]:
    """A call as a task's line, and the values the task reads. A call whose pickle is larger
    than `limit` is put on a worker with ``place(name, data)`` and the line names it."""
    data, names = dumps_call(args, kwargs, remote)
    if not limit or len(data) <= limit:
        return base64.b64encode(data).decode(), names
    name = new_name("a")
    place(name, data)
    return "@" + name, [*names, name]
