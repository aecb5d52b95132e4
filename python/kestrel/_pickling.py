"""How calls are pickled: cloudpickle, but keeping the file names of code pickled by value.

cloudpickle writes ``<dynamic-code>`` for the file name of every function it pickles by value
(those of ``__main__``, a notebook, or defined inside another function), so that the same
function always gives the same bytes. A task's traceback then names no file and shows no
source line. Kestrel needs no such determinism, so its pickler puts the real name back; the
runner needs nothing for it (the code object is rebuilt by ``types.CodeType`` as before), and
on a worker that sees the client's files the traceback shows the source lines too.
"""

from __future__ import annotations

import collections
import io
import pickle
import types
from typing import Any, ClassVar

import cloudpickle

# What cloudpickle writes in place of a file name.
_BLANK = "<dynamic-code>"
_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_with_its_file(code: types.CodeType) -> tuple:
    rebuild, args = _code_reduce(code)[:2]
    args = tuple(code.co_filename if a == _BLANK else a for a in args)
    return rebuild, args


class _Pickler(cloudpickle.Pickler):
    dispatch_table: ClassVar[collections.ChainMap] = collections.ChainMap(
        {types.CodeType: _code_with_its_file}, cloudpickle.Pickler.dispatch_table
    )


def dumps(obj: Any) -> bytes:
    """`obj` pickled as cloudpickle does, its code keeping the names of its files."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()
