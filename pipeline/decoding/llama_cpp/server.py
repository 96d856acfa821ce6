"""One ``llama-server`` process: started on a free localhost port, ready once ``/health`` answers 200, asked for
completions over HTTP, and stopped cleanly.

Every started server is kept in a module-level set: :func:`stop_all` (the runner calls it when a run ends, also on
error) and an ``atexit`` hook stop them, and on Linux each server is its parent's child under ``PR_SET_PDEATHSIG``,
so it gets SIGTERM even when the Python process dies without running its hooks: no server outlives its run. Stopping
sends SIGTERM, waits, then SIGKILL. The server's own log goes to a temporary file, removed when it stops cleanly; a
server that exits or fails to become ready raises a one-line :class:`SpecsweepError` with the log's last error line.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.env_info import count_as_own
from pipeline.errors import SpecsweepError

READY_TIMEOUT_S = 600.0
"""How long a server may take to load its models (a 1.5B target and its draft from a cold disk: seconds)."""
STOP_TIMEOUT_S = 10.0
_LIVE: set[LlamaServer] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _libc_prctl():
    """libc's ``prctl``, looked up once in the parent (the forked child then only calls it); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux's PR_SET_PDEATHSIG; elsewhere nothing)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM))


class LlamaServer:
    """``binary`` started with ``args`` (besides host and port); :meth:`start` returns once it is ready."""

    def __init__(self, binary: Path, args: list[str], name: str = "llama-server") -> None:
        self.binary, self.args, self.name = Path(binary), list(args), name
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        self.log: Path | None = None
        self._conn: http.client.HTTPConnection | None = None

    @property
    def command(self) -> list[str]:
        return [str(self.binary), *self.args, "--host", "127.0.0.1", "--port", str(self.port)]

    def start(self, timeout: float = READY_TIMEOUT_S) -> LlamaServer:
        if self.process is not None:
            return self
        fd, log = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
        self.log, self.port = Path(log), free_port()
        with os.fdopen(fd, "w") as out:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        _LIVE.add(self)
        count_as_own(self.process.pid)      # its CPU time is the run's, not other load (pipeline/env_info.py)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SpecsweepError(f"{self.name} exited with code {self.process.returncode} before it was ready: "
                                     f"{self.last_error()} (log: {self.log})")
            try:
                status, _ = self._request("GET", "/health", None, timeout=2.0)
                if status == 200:
                    return
            except (OSError, http.client.HTTPException):
                self._close_connection()
            time.sleep(0.05)
        raise SpecsweepError(f"{self.name} was not ready after {timeout:.0f} s: {self.last_error()} (log: {self.log})")

    def last_error(self) -> str:
        """The log's last line that names an error, else its last line."""
        try:
            lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except (OSError, AttributeError):
            return "no log"
        errors = [line for line in lines if any(w in line.lower() for w in ("error", "failed", "invalid"))]
        return ((errors or lines or ["an empty log"])[-1])[:240]

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _request(self, method: str, path: str, body: dict | None, timeout: float | None) -> tuple[int, dict]:
        conn = self._connection(timeout)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn.request(method, path, body=data, headers=headers)
        reply = conn.getresponse()
        raw = reply.read()
        try:
            return reply.status, json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return reply.status, {"raw": raw[:200].decode(errors="replace")}

    def get(self, path: str, timeout: float = 10.0) -> dict:
        """GET ``path`` (e.g. ``/props``): the reply's JSON, {} when it is not 200 or the server does not answer."""
        try:
            status, reply = self._request("GET", path, None, timeout)
        except (OSError, http.client.HTTPException):
            self._close_connection()
            return {}
        return reply if status == 200 else {}

    def complete(self, body: dict, timeout: float | None = 3600.0) -> dict:
        """POST /completion with ``body``; the reply's JSON, or a one-line error with the server's message."""
        if self.process is None or self.process.poll() is not None:
            raise SpecsweepError(f"{self.name} is not running: {self.last_error()} (log: {self.log})")
        try:
            status, reply = self._request("POST", "/completion", body, timeout)
        except (OSError, http.client.HTTPException):
            self._close_connection()       # a dropped keep-alive connection: one retry on a fresh one
            try:
                status, reply = self._request("POST", "/completion", body, timeout)
            except (OSError, http.client.HTTPException) as e:
                raise SpecsweepError(f"{self.name} did not answer ({e}): {self.last_error()} (log: {self.log})") \
                    from None
        if status != 200:
            message = (reply.get("error") or {}).get("message") if isinstance(reply.get("error"), dict) else reply
            raise SpecsweepError(f"{self.name} answered {status}: {str(message)[:240]}")
        return reply

    def stop(self, keep_log: bool = False) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S`; the log removed unless ``keep_log``."""
        self._close_connection()
        process, self.process = self.process, None
        _LIVE.discard(self)
        if process is not None:
            count_as_own(process.pid, own=False)
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.log is not None and not keep_log:
            with contextlib.suppress(OSError):
                self.log.unlink()


def stop_all() -> None:
    """Stop every server this process started and has not stopped."""
    for server in list(_LIVE):
        server.stop()


def live() -> list[LlamaServer]:
    """The servers running now (tests check that none is left)."""
    return [s for s in _LIVE if s.process is not None]


atexit.register(stop_all)
