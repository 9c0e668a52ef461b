"""``envrl webshop serve``: the WebShop site under gunicorn.

    envrl webshop serve --host 127.0.0.1 --port 3000 [--workers N] [--products N] [--data-dir D]

The store (catalog, goals, search index) is loaded once in the master process, before the
workers fork (``preload_app``), so every worker shares it copy-on-write; ``gc.freeze()``
keeps the collector from dirtying those shared pages (measured: PSS under load 90 MB with it,
109 MB and growing without).

Workers: ``--workers`` processes (default one per CPU), each a gevent event loop
(:func:`worker_class`), not threads. With gunicorn's ``gthread`` workers every connection
that had sent part of its headers held a thread until the rest came, and was never closed:
40 clients sending headers slowly stopped ``/healthz`` and most requests (README, WebShop
server). An event loop parks a waiting connection for the price of a greenlet, a client gets
``HEADER_TIMEOUT`` s to send a request's headers however it trickles them, and requests run
one at a time per worker, taking turns (``benchmarks/webshop_load.py`` measures both).
A request body is read by the site as it comes (the
site's POST bodies are one short form field): that wait costs a greenlet, never a worker.

The site is stateless (a session is its URL: ``/fixed_<i>`` is goal ``i``), so memory does
not grow with the number of sessions. ``GET /healthz`` answers
``{"status": "ok", "products": N, "goals": M}`` once the server is up.

SIGTERM stops it gracefully (in-flight requests finish, at most ``GRACEFUL_TIMEOUT`` s), SIGINT
at once; both exit 0. The port defaults to ``$WEBSHOP_PORT``, else 3000, so a container can
be moved to another port without changing its command.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from envrl.ports import check_port

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3000
#: seconds a worker may take for one request before gunicorn restarts it
WORKER_TIMEOUT = 60
#: seconds SIGTERM waits for in-flight requests
GRACEFUL_TIMEOUT = 5
#: seconds a client has to send a request's headers, counted from its connection or from the
#: end of the previous response on a kept-alive one (so also the keep-alive idle limit); then
#: the connection is closed. A slow client can hold a connection this long and no longer.
HEADER_TIMEOUT = 5
#: seconds a stopping worker still waits for requests on idle connections (one already on its
#: way gets answered) before it closes them
STOP_LINGER = 1.0
#: the most connections one worker holds at once (accepting pauses beyond it)
WORKER_CONNECTIONS = 1000


def default_port() -> int:
    """``$WEBSHOP_PORT``, else 3000 (ValueError when it is not a number)."""
    value = os.environ.get("WEBSHOP_PORT", "").strip()
    if not value:
        return DEFAULT_PORT
    if not value.isdigit():
        raise ValueError(f"$WEBSHOP_PORT must be a port number, got {value!r}")
    return int(value)


def default_workers() -> int:
    """One worker per CPU (searching is CPU-bound), at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


@dataclass(frozen=True)
class ServeOptions:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    workers: int = 1
    products: int | None = None
    data_dir: str | None = None
    log_level: str = "info"
    access_log: bool = False

    def check(self) -> None:
        """ValueError with a one-line reason for options that cannot work."""
        try:
            check_port(self.port)
        except ValueError as exc:
            raise ValueError(f"--port {exc}") from None
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.products is not None and self.products < 1:
            raise ValueError(f"--products must be >= 1, got {self.products}")
        if self.data_dir is not None and not os.path.isdir(self.data_dir):
            raise ValueError(f"--data-dir {self.data_dir!r} is not a directory")

    @property
    def bind(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


@functools.cache
def worker_class() -> type:
    """gunicorn's gevent worker, bounded and fair; built on first use (importing gevent is slow).

    Its changes: a request's headers, the first or a kept-alive one's, must arrive within
    ``HEADER_TIMEOUT`` in all (not per read, which a client sending a byte now and then
    would defeat); after each response the worker lets the other ready connections go first;
    a stopping worker ends idle header waits after ``STOP_LINGER`` s instead of waiting them
    out; and it leaves with ``os._exit``.
    """
    import gevent
    from gunicorn.workers.ggevent import GeventWorker

    class FairGeventWorker(GeventWorker):
        waiting: dict[Any, Any]  # greenlet -> the timeout of the headers it waits for
        stopping_since: float | None

        def init_process(self) -> None:
            """Serve until told to stop, then end the process with ``os._exit``, as
            multiprocessing's children do: after gevent's monkey-patching, the interpreter's
            teardown prints an ignored ``TypeError`` (gevent's ``get_ident``) for every logging
            handler it collects. (So gunicorn's ``worker_exit`` hook, unused here, never runs.)"""
            self.waiting, self.stopping_since = {}, None
            code = 0
            try:
                super().init_process()
            except SystemExit as stop:  # SIGQUIT/SIGINT: gunicorn's own sys.exit
                code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
            self.log.info("Worker exiting (pid: %s)", self.pid)
            _exit_now(code)

        @contextlib.contextmanager
        def timeout_ctx(self) -> Iterator[None]:
            """Read one request's headers within ``HEADER_TIMEOUT``; on time-out the connection
            closes. Meanwhile the greenlet is listed as waiting (see ``notify``)."""
            timeout = gevent.Timeout(HEADER_TIMEOUT, False)
            me = gevent.getcurrent()
            self.waiting[me] = timeout
            try:
                with timeout:
                    yield
            finally:
                self.waiting.pop(me, None)

        def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
            """Serve, then go to the back of the line. A client on the same machine often sends
            its next request before the worker looks again, and the worker would serve it at
            once: a few fast connections took most turns (measured on 2 busy cores: p50 1.2 ms,
            p99 250 ms, against p50 about the mean with this)."""
            result = super().handle_request(listener_name, req, sock, addr)
            gevent.sleep(0)
            return result

        def notify(self) -> None:
            """The heartbeat (every second); once stopping for ``STOP_LINGER`` s, it also ends
            the header waits, which would otherwise hold the shutdown ``HEADER_TIMEOUT`` s
            for every idle kept-alive connection."""
            super().notify()
            if self.alive:
                return
            now = time.monotonic()
            self.stopping_since = self.stopping_since or now
            if now - self.stopping_since >= STOP_LINGER:
                loop = gevent.get_hub().loop
                for greenlet, timeout in list(self.waiting.items()):
                    loop.run_callback(self._end_wait, greenlet, timeout)

        def _end_wait(self, greenlet: Any, timeout: Any) -> None:
            """As if ``timeout`` had fired: checked in the hub, so the greenlet cannot have
            started on a request between the check and the throw."""
            if self.waiting.get(greenlet) is timeout:
                greenlet.throw(timeout)

    return FairGeventWorker


def _exit_now(code: int) -> None:
    """Flush what was written and end this process at once, skipping the interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed or replaced
            pass
    os._exit(code)


def _gunicorn_application(app: Any, settings: dict[str, Any]) -> Any:
    """A gunicorn application serving the already-built WSGI ``app`` with ``settings``."""
    from gunicorn.app.base import BaseApplication

    class WebShopApplication(BaseApplication):
        def __init__(self) -> None:
            self.application = app
            super().__init__()

        def load_config(self) -> None:
            known = self.cfg.settings
            for key, value in settings.items():
                if key in known:  # settings newer than the installed gunicorn are skipped
                    self.cfg.set(key, value)

        def load(self) -> Any:
            return self.application

    return WebShopApplication()


def gunicorn_settings(options: ServeOptions, banner: str = "") -> dict[str, Any]:
    """The gunicorn configuration for ``options`` (a plain dict, for tests and the benchmark)."""

    def when_ready(server: Any) -> None:
        for listener in server.LISTENERS:
            server.log.info(
                "envrl webshop: %s; serving at http://%s (%d gevent workers)",
                banner,
                _address(listener),
                options.workers,
            )

    return {
        "bind": [options.bind],
        "workers": options.workers,
        "worker_class": worker_class(),
        "worker_connections": WORKER_CONNECTIONS,
        "preload_app": True,
        "timeout": WORKER_TIMEOUT,
        "graceful_timeout": GRACEFUL_TIMEOUT,
        # the gevent worker reads every request under a timeout of this many seconds (see
        # worker_class); with 0 it would read the headers with no time limit at all
        "keepalive": HEADER_TIMEOUT,
        "backlog": 2048,
        "loglevel": options.log_level,
        "accesslog": "-" if options.access_log else None,
        "errorlog": "-",
        "proc_name": "envrl-webshop",
        # gunicorn >= 25 opens a control socket at ~/.gunicorn/gunicorn.ctl by default: two
        # servers on one machine would fight over it, and nothing here uses it.
        "control_socket_disable": True,
        # the heartbeat files of the workers: /dev/shm where it exists (no disk I/O)
        "worker_tmp_dir": "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None,
        "when_ready": when_ready,
    }


def _address(listener: Any) -> str:
    try:
        host, port = listener.sock.getsockname()[:2]
    except (AttributeError, OSError, ValueError):
        return str(listener)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def build_site(products: int | None = None, data_dir: str | None = None) -> tuple[Any, Any]:
    """``(app, store)``: the site over ``load_store(products, data_dir)``."""
    from envrl.envs.webshop.site import create_app
    from envrl.envs.webshop.store import load_store

    store = load_store(num_products=products, data_dir=data_dir)
    return create_app(store), store


def serve(options: ServeOptions) -> int:
    """Load the store, then serve the site until SIGTERM/SIGINT; returns the exit code.

    Raises ValueError for options that cannot work (before anything is loaded).
    """
    options.check()
    app, store = build_site(options.products, options.data_dir)
    banner = f"{len(store.products)} products, {len(store.goals)} goals"
    # Everything loaded so far lives as long as the server: move it out of the collector's
    # reach so that collections in the workers do not copy the shared pages.
    gc.collect()
    gc.freeze()
    try:
        _gunicorn_application(app, gunicorn_settings(options, banner)).run()
    except SystemExit as exc:  # gunicorn's arbiter leaves through sys.exit
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "HEADER_TIMEOUT",
    "ServeOptions",
    "build_site",
    "default_port",
    "default_workers",
    "gunicorn_settings",
    "serve",
    "worker_class",
]
