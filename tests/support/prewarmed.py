"""``Prewarmed``: a Python process that imported aioqueue once and forks a child per program.

A program the suite runs as a user would (a documentation example, a command line) pays for
starting Python and importing aioqueue, redis-py, anyio and uvloop each time: about a third of
a CPU second, more than most examples spend on their own work. A prewarmed process pays it
once; each program then runs in a child forked from it, a process of its own with its own
working directory, environment, ``sys.path``, ``sys.argv`` and standard streams, as
``python SCRIPT`` (or ``python -m MODULE``) would give it. The modules the parent imported are
shared as they were imported, which is what a fresh interpreter would have imported anyway;
nothing of the program's own is imported in the parent.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The parent's loop: one request per line on stdin, one reply per line on stdout. It imports
# what every program would import, then forks for each request.
_SERVER = r"""
import json, os, sys, time, traceback, runpy, signal
import aioqueue, aioqueue._cli.main, redis.asyncio, anyio, uvloop, orjson  # paid once here

def child(req):
    fd = os.open(req["stdin"] or os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    for target, path in ((1, req["stdout"]), (2, req["stderr"])):
        if target == 2 and path == req["stdout"]:
            os.dup2(1, 2)  # one file for both, as Popen(stdout=f, stderr=f)
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    code = 0
    try:
        if req.get("module"):
            sys.argv = [req["module"], *req["args"]]
            sys.path[:] = [req["cwd"], *extra, *sys.path[1:]]
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        else:
            script = os.path.join(req["cwd"], req["script"])
            sys.argv = [req["script"], *req["args"]]
            sys.path[:] = [os.path.dirname(script), *extra, *sys.path[1:]]
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

spawned = set()
for line in sys.stdin:
    req = json.loads(line)
    op = req.get("op", "run")
    if op == "poll":
        rc = None
        if req["pid"] in spawned:
            done, status = os.waitpid(req["pid"], os.WNOHANG)
            if done:
                spawned.discard(req["pid"])
                rc = os.waitstatus_to_exitcode(status)
        print(json.dumps({"rc": rc}), flush=True)
        continue
    if op == "signal":
        if req["pid"] in spawned:
            os.kill(req["pid"], req["signal"])
        print(json.dumps({}), flush=True)
        continue
    pid = os.fork()
    if pid == 0:
        child(req)
    if op == "spawn":  # a long-running program: its pid now, its end by "poll"
        spawned.add(pid)
        print(json.dumps({"pid": pid}), flush=True)
        continue
    deadline = time.monotonic() + req["timeout"]
    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            timed_out = True
            status = -1
            break
        time.sleep(0.005)
    rc = -1 if timed_out else os.waitstatus_to_exitcode(status)
    print(json.dumps({"rc": rc, "timed_out": timed_out}), flush=True)

for pid in spawned:  # the test process is gone: none of its programs outlives it
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""


def _program(
    args: list[str],
    cwd: Path | str,
    env: dict[str, str],
    *,
    stdout: Path,
    stderr: Path,
    stdin: Path | None = None,
    module: str | None = None,
    script: str | None = None,
) -> dict[str, object]:
    """What the prewarmed process's ``child`` needs to run one program."""
    return {
        "cwd": str(cwd),
        "env": env,
        "stdout": str(stdout),
        "stderr": str(stderr),
        "stdin": None if stdin is None else str(stdin),
        "module": module,
        "script": script,
        "args": args,
    }


class Prewarmed:
    """Runs programs in children forked from one process that imported aioqueue already.

    Use as a context manager; :meth:`run` is :func:`subprocess.run` with ``capture_output`` and
    ``text`` for ``python SCRIPT ARGS`` or (``module=``) ``python -m MODULE ARGS``. Calls are
    serialised (one child at a time), as the suite's tests of one process run one at a time.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()  # one program run at a time
        self._io = threading.Lock()  # one request at a time on the pipe
        self._dir = tempfile.TemporaryDirectory(prefix="prewarmed-")

    def __enter__(self) -> Prewarmed:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        return self

    def __exit__(self, *exc_info: object) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._dir.cleanup()

    def _call(self, request: Mapping[str, object]) -> dict[str, Any]:
        """One request, one reply (the caller holds the lock, or the request is brief)."""
        with self._io:
            proc = self._proc
            assert proc is not None
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the prewarmed process died (exit {proc.poll()})")
            reply: dict[str, Any] = json.loads(line)
            return reply

    def spawn(self, args: list[str], *, cwd: Path | str, env: dict[str, str], log: Path) -> Forked:
        """``python -m ARGS[0] ARGS[1:]`` started in a forked child, its output (both streams)
        written to ``log``; returns at once."""
        request = _program(args[1:], cwd, env, stdout=log, stderr=log, module=args[0])
        with self._lock:
            pid = self._call({**request, "op": "spawn"})["pid"]
        return Forked(self, pid, [sys.executable, "-m", *args])

    def run(
        self,
        args: list[str],
        *,
        cwd: Path | str,
        env: dict[str, str],
        timeout: float,
        module: str | None = None,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``python ARGS[0] ARGS[1:]`` (a script in ``cwd``), or with ``module``,
        ``python -m MODULE ARGS``, in a forked child; its output captured as text, ``stdin``
        its input (none: ``/dev/null``).

        Raises:
            subprocess.TimeoutExpired: the program ran longer than ``timeout`` (killed).
        """
        with self._lock:
            out, err = Path(self._dir.name, "stdout"), Path(self._dir.name, "stderr")
            given = Path(self._dir.name, "stdin")
            if stdin is not None:
                given.write_text(stdin)
            request = _program(
                args if module else args[1:],
                cwd,
                env,
                stdout=out,
                stderr=err,
                stdin=None if stdin is None else given,
                module=module,
                script=None if module else args[0],
            )
            reply = self._call({**request, "timeout": timeout})
            stdout, stderr = out.read_text(), err.read_text()
        command = [sys.executable, *(["-m", module] if module else []), *args]
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
        return subprocess.CompletedProcess(command, reply["rc"], stdout, stderr)


# one prewarmed process per role and test process, started on first use, stopped at exit: the
# spawner has its own, so that a start never waits behind a program run to its end
_STARTED: dict[str, Prewarmed] = {}


def _prewarmed(role: str) -> Prewarmed:
    if role not in _STARTED:
        started = _STARTED[role] = Prewarmed().__enter__()
        atexit.register(started.__exit__, None, None, None)
    return _STARTED[role]


def run_aioqueue(
    args: list[str] | tuple[str, ...],
    *,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m aioqueue ARGS`` to its end, as ``subprocess.run(..., capture_output=True,
    text=True)`` runs it (``env``: this process's environment when not given), forked from this
    test process's prewarmed process (started on first use, stopped at exit)."""
    return _prewarmed("run").run(
        list(args),
        module="aioqueue",
        cwd=os.getcwd() if cwd is None else cwd,
        env=dict(os.environ) if env is None else env,
        timeout=timeout,
        stdin=stdin,
    )


class Forked:
    """A long-running program forked by a :class:`Prewarmed` (:meth:`Prewarmed.spawn`): the
    part of :class:`subprocess.Popen` the suite uses (``pid``, ``poll``, ``wait``,
    ``returncode``, ``send_signal``, ``kill``). A process of its own: its signals are real."""

    def __init__(self, owner: Prewarmed, pid: int, args: list[str]) -> None:
        self._owner = owner
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._owner._call({"op": "poll", "pid": self.pid})["rc"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.005)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self._owner._call({"op": "signal", "pid": self.pid, "signal": int(sig)})

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn_aioqueue(args: list[str], *, cwd: Path | str, env: dict[str, str], log: Path) -> Forked:
    """``python -m aioqueue ARGS``, running on (a worker, an exporter) in a forked child of this
    test process's prewarmed spawner: a process of its own, started a third of a CPU second
    sooner."""
    return _prewarmed("spawn").spawn(["aioqueue", *args], cwd=cwd, env=env, log=log)
