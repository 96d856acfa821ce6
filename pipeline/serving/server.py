"""Running the app with uvicorn: :func:`serve` in the foreground (``specsweep serve``: SIGINT or SIGTERM shuts it
down gracefully), :class:`BackgroundServer` in a daemon thread (the tests).

Both bind the listening socket themselves, so port 0 takes a free port and the log names the real one. Graceful
shutdown is uvicorn's: stop accepting connections, wait for the open ones to finish their answers (at most
``graceful_timeout`` seconds), then the app's lifespan ends, which lets the batcher finish what it holds.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from pipeline.errors import SpecsweepError

log = logging.getLogger("specsweep.serve")


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: a free one).

    Its protocol is named (IPPROTO_TCP), not left 0: asyncio switches Nagle's algorithm off (TCP_NODELAY) only on
    connections whose socket says TCP, and with Nagle on, an answer written in two parts (headers, then body) waits
    for the client's delayed ACK, about 40 ms on Linux, before its second part leaves."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()

        raise SpecsweepError(f"cannot listen on {host}:{port} ({e.strerror}): pick another --port (0: any free "
                             "one) or stop what holds it") from None
    sock.set_inheritable(True)
    return sock


def _config(app, log_level: str, access_log: bool, graceful_timeout: float | None):
    import uvicorn

    return uvicorn.Config(app, lifespan="on", log_level=log_level, access_log=access_log,
                          timeout_graceful_shutdown=graceful_timeout)


def serve(app, host: str, port: int, *, log_level: str = "info", access_log: bool = False,
          graceful_timeout: float | None = None) -> None:
    """Serve ``app`` on host:port until SIGINT/SIGTERM, then shut down gracefully."""
    import uvicorn

    sock = bind(host, port)
    log.info("listening on http://%s:%d", host if ":" not in host else f"[{host}]", sock.getsockname()[1])
    uvicorn.Server(_config(app, log_level, access_log, graceful_timeout)).run(sockets=[sock])


class BackgroundServer:
    """``app`` served by uvicorn in a daemon thread on host:port (0: a free port); ``url`` is where it listens.

        with BackgroundServer(app) as server:
            httpx.get(server.url + "/health")

    ``stop()`` shuts it down as SIGTERM would (in-flight requests finish first)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                 graceful_timeout: float | None = 30.0) -> None:
        import uvicorn

        self.sock = bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = uvicorn.Server(_config(app, log_level, False, graceful_timeout))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="specsweep-server", daemon=True)

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        """Start serving; returns once the app is ready (its lifespan started), or raises RuntimeError."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see the log above)")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> bool:
        """Shut down gracefully; returns whether it stopped within ``timeout`` seconds."""
        self.server.should_exit = True
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
