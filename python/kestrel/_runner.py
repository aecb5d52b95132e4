"""The Python runner a Kestrel worker keeps per slot: it calls function tasks.

The worker starts it once (``python -c`` with a few lines that read this file's text as the
first frame on stdin and run it) and speaks frames on its stdin and stdout; it needs the standard library alone, and cloudpickle for functions pickled by value.
It is embedded in the ``kestrel`` binary, so a worker's Python needs no Kestrel package.

A frame is a little-endian u32 length, then that many bytes, the first of which says what
the frame is:

worker to runner
    ``D`` job:u32, header length:u32, header (JSON: name, python, cloudpickle, modules, path,
    env, inline_limit), the pickled function: defines job ``job``'s function.
    ``C`` job:u32, task id:u32, the task's line (base64 of the pickled ``(args, kwargs)``, or
    ``@NAME``: the pickled call is value NAME): calls it.
    ``V`` job:u32, task id:u32, count:u32, that many (name length:u32, name, path length:u32,
    path), the task's line: calls it, the values it reads staged at those paths.
    ``F`` job:u32: forgets the job's function.
runner to worker
    ``H`` JSON (python, cloudpickle, executable, pid): once, when it is ready.
    ``R`` status:u8, result length:u32, text length:u32, result, text, output: a call's end.
    Status 0: returned (result: the pickled value); 1: raised (result: the pickled
    exception, text: its traceback); 2: cannot run here (text: why; not worth a retry);
    3: returned a value larger than the job's inline limit, pickled into a file of the
    directory ``KESTREL_SPILL_DIR`` names (result: its path), for the worker to keep in its
    cache. Output is what the call printed.

Values (Python results and arguments kept in the workers' caches) appear in a call's pickle as
persistent ids ``("kestrel-value", NAME)``, loaded from the paths the ``V`` frame gave.

What the function prints is captured per call; the protocol's stdout is kept apart from the
process's file descriptor 1, which goes to stderr, so that nothing a C extension writes can
corrupt a frame.
"""

import base64
import contextlib
import importlib
import io
import json
import os
import pickle
import platform
import struct
import sys
import traceback

U32 = struct.Struct("<I")
CALL = struct.Struct("<II")
VALUES = struct.Struct("<III")
END = struct.Struct("<BII")

# Where results above the inline limit are written (the worker's cache's own disk); the user's
# function does not see the variable.
SPILL_DIR = os.environ.pop("KESTREL_SPILL_DIR", None)

try:
    import cloudpickle
except ImportError:  # Functions pickled by reference still load with plain pickle.
    cloudpickle = None


def cloudpickle_version():
    return getattr(cloudpickle, "__version__", "") if cloudpickle else ""


def read_exact(fd, n):
    parts = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def write_frame(fd, body):
    data = memoryview(U32.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


def dumps(value):
    """Pickles a result or an exception: plainly if it can, else by value (a lambda)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        if cloudpickle is None:
            raise
        return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


class ValueUnpickler(pickle.Unpickler):
    """Unpickles a call whose values are persistent ids, loading each from its staged file
    (once, however often the call refers to it)."""

    def __init__(self, file, values, loaded=None):
        super().__init__(file)
        self.values = values
        self.loaded = {} if loaded is None else loaded

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 2 and pid[0] == "kestrel-value"):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        name = pid[1]
        if name in self.loaded:
            return self.loaded[name]
        path = self.values.get(name)
        if path is None:
            raise pickle.UnpicklingError(f"value {name} was not staged for this call")
        with open(path, "rb") as f:
            value = ValueUnpickler(f, self.values, self.loaded).load()
        self.loaded[name] = value
        return value


def load_call(line, values):
    """The ``(args, kwargs)`` of a task's line: inline, or a value of its own (``@NAME``)."""
    if not values and not line.startswith(b"@"):
        # Most calls read no value: the plain unpickler, without a Python subclass per call.
        try:
            return pickle.loads(base64.b64decode(line))
        except pickle.UnpicklingError:
            pass  # A persistent id with nothing staged: said below.
    if line.startswith(b"@"):
        name = line[1:].decode()
        path = values.get(name)
        if path is None:
            raise pickle.UnpicklingError(f"the call's value {name} was not staged")
        with open(path, "rb") as f:
            return ValueUnpickler(f, values).load()
    return ValueUnpickler(io.BytesIO(base64.b64decode(line)), values).load()


class Spool:
    """Where a result is pickled: in memory up to the job's inline limit, past it a file in
    the spill directory (so a large result is never held twice in memory)."""

    def __init__(self, limit, name):
        self.limit = limit
        self.name = name
        self.parts = []
        self.size = 0
        self.file = None
        self.path = None

    def write(self, data):
        if self.file is None and (not self.limit or self.size + len(data) <= self.limit):
            self.parts.append(bytes(data))
        else:
            if self.file is None:
                if SPILL_DIR is None:
                    raise ResultTooLarge()
                self.path = os.path.join(SPILL_DIR, self.name)
                # Written by each call of the pickler, closed by `spool` or `discard`.
                self.file = open(self.path, "wb")  # noqa: SIM115
                for part in self.parts:
                    self.file.write(part)
                self.parts = []
            self.file.write(data)
        self.size += len(data)
        return len(data)

    def discard(self):
        if self.file is not None:
            self.file.close()
            with contextlib.suppress(OSError):
                os.remove(self.path)
        self.file, self.path, self.parts, self.size = None, None, [], 0


class ResultTooLarge(Exception):
    """A result above the inline limit, on a worker with no cache to keep it in."""


def spool(value, limit, name):
    """Pickles `value` into a :class:`Spool` (plainly if it can, else by value), closed."""
    out = Spool(limit, name)
    try:
        pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except ResultTooLarge:
        raise
    except Exception:
        if cloudpickle is None:
            out.discard()
            raise
        out.discard()
        cloudpickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    if out.file is not None:
        out.file.close()
    return out


def module_version(name):
    try:
        module = importlib.import_module(name)
    except Exception:
        return None
    return str(getattr(module, "__version__", ""))


def mismatch(header):
    """Why pickles made by the client's Python cannot be trusted here, if they cannot."""
    mine = platform.python_version()
    theirs = header.get("python") or ""
    if theirs and theirs.split(".")[:2] != mine.split(".")[:2]:
        return f"Python {theirs} on the client, Python {mine} here ({sys.executable})"
    theirs = header.get("cloudpickle") or ""
    if theirs and theirs != cloudpickle_version():
        here = cloudpickle_version() or "not installed"
        return f"cloudpickle {theirs} on the client, {here} here ({sys.executable})"
    for name, version in header.get("modules") or []:
        here = module_version(name)
        if here is None:
            return f"module {name} {version} on the client, not importable here ({sys.executable})"
        if version and here != version:
            return f"module {name} {version} on the client, {here} here ({sys.executable})"
    return None


class TaskIdVariable:
    """``KESTREL_TASK_ID``, set for each call without a leak: glibc's setenv, behind
    ``os.environ``, keeps every value it was ever given (60 MB a million calls), so the
    variable is one buffer of this process's, given to putenv once and rewritten in place."""

    PREFIX = b"KESTREL_TASK_ID="

    def __init__(self):
        self.buffer = None
        data = getattr(os.environ, "_data", None)
        try:
            import ctypes

            buffer = ctypes.create_string_buffer(len(self.PREFIX) + 11)  # a u32's 10 digits
            buffer.value = self.PREFIX + b"0"
            if isinstance(data, dict) and ctypes.CDLL(None).putenv(buffer) == 0:
                self.buffer, self.data = buffer, data
                self.key = os.environ.encodekey("KESTREL_TASK_ID")
        except Exception:  # no ctypes or no putenv here: os.environ, and its leak
            self.buffer = None

    def set(self, task_id):
        if self.buffer is None:
            os.environ["KESTREL_TASK_ID"] = str(task_id)
            return
        value = str(task_id).encode()
        self.buffer.value = self.PREFIX + value
        # What os.environ reads, without a setenv.
        self.data[self.key] = value


class JobEnvironment:
    """The variables of the job whose calls run (its ``env`` option and the ``KESTREL_*``
    the worker adds), set when a call of another job comes, not for each call."""

    def __init__(self):
        self.job = None

    def enter(self, job):
        if job is self.job:
            return
        before = self.job.env if self.job is not None else {}
        for name in before:
            if name not in job.env:
                os.environ.pop(name, None)
        for name, value in job.env.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        self.job = job


class Job:
    def __init__(self, header, pickled):
        self.name = header.get("name") or "function"
        self.inline_limit = int(header.get("inline_limit") or 0)
        self.env = dict(header.get("env") or [])
        self.error = None
        self.function = None
        why = mismatch(header)
        if why:
            self.error = (
                f"function {self.name} cannot run on this worker: {why}; start the worker "
                "with `--python PATH` naming an interpreter with the client's versions"
            )
            return
        for entry in reversed(header.get("path") or []):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        try:
            self.function = pickle.loads(pickled)
        except Exception as e:
            self.error = f"function {self.name} cannot be unpickled here: {type(e).__name__}: {e}"


def call(job, task_id, line, values, task_var, job_env):
    """Runs one call: (status, result, text, output)."""
    if job.error:
        return 2, b"", job.error, ""
    printed = io.StringIO()
    job_env.enter(job)
    task_var.set(task_id)
    try:
        args, kwargs = load_call(line, values)
    except Exception as e:
        return 2, b"", f"the arguments of task {task_id} cannot be unpickled here: {e!r}", ""
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            value = job.function(*args, **kwargs)
    except BaseException as e:  # the task's failure, whatever it is (SystemExit too)
        if isinstance(e, SystemExit) and e.code in (0, None):
            value = None
        else:
            # From the function's own frame on: the runner's frame says nothing to its user
            # (unless it is the only one, a builtin that raised).
            tb = e.__traceback__
            if tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            text = "".join(traceback.format_exception(type(e), e, tb))
            try:
                pickled = dumps(e)
            except Exception:
                pickled = dumps(RuntimeError(f"{type(e).__name__}: {e}"))
            return 1, pickled, text, printed.getvalue()
    try:
        out = spool(value, job.inline_limit, f"{os.getpid()}-{task_id}.result")
    except ResultTooLarge:
        why = (
            f"the result of {job.name} is above the {job.inline_limit} bytes a result may "
            "carry back, and this worker has no cache to keep it in; return a smaller value, "
            "or write a file and declare it as an output"
        )
        return 2, b"", why, printed.getvalue()
    except OSError as e:
        why = (
            f"the result of {job.name} could not be written to the worker's cache directory "
            f"({e}); return a smaller value, or write a file and declare it as an output"
        )
        return 2, b"", why, printed.getvalue()
    except Exception as e:
        why = f"the result of {job.name} cannot be pickled: {type(e).__name__}: {e}"
        return 2, b"", why, printed.getvalue()
    if out.path is not None:
        return 3, out.path.encode(), "", printed.getvalue()
    return 0, b"".join(out.parts), "", printed.getvalue()


def main():
    inp = 0
    # The protocol's own descriptor; fd 1 then goes where fd 2 goes.
    out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    hello = {
        "python": platform.python_version(),
        "cloudpickle": cloudpickle_version(),
        "executable": sys.executable,
        "pid": os.getpid(),
    }
    write_frame(out, b"H" + json.dumps(hello).encode())
    jobs = {}
    task_var = TaskIdVariable()
    job_env = JobEnvironment()
    while True:
        head = read_exact(inp, 4)
        if head is None:
            return
        (n,) = U32.unpack(head)
        body = read_exact(inp, n)
        if body is None:
            return
        tag = body[:1]
        if tag in (b"C", b"V"):
            values = {}
            if tag == b"C":
                job_id, task_id = CALL.unpack_from(body, 1)
                at = 9
            else:
                job_id, task_id, count = VALUES.unpack_from(body, 1)
                at = 13
                for _ in range(count):
                    (n,) = U32.unpack_from(body, at)
                    name = body[at + 4 : at + 4 + n].decode()
                    at += 4 + n
                    (n,) = U32.unpack_from(body, at)
                    values[name] = body[at + 4 : at + 4 + n].decode()
                    at += 4 + n
            job = jobs.get(job_id)
            if job is None:
                status, result, text, output = 2, b"", f"job {job_id} was not defined", ""
            else:
                line = body[at:]
                status, result, text, output = call(job, task_id, line, values, task_var, job_env)
            text_b, output_b = text.encode(), output.encode(errors="replace")
            end = END.pack(status, len(result), len(text_b))
            write_frame(out, b"R" + end + result + text_b + output_b)
        elif tag == b"D":
            job_id, hlen = CALL.unpack_from(body, 1)
            header = json.loads(body[9 : 9 + hlen])
            jobs[job_id] = Job(header, body[9 + hlen :])
        elif tag == b"F":
            (job_id,) = U32.unpack_from(body, 1)
            jobs.pop(job_id, None)


main()
