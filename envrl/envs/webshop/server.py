"""``envrl webshop serve``: the WebShop site under gunicorn.

    envrl webshop serve --host 127.0.0.1 --port 3000 [--workers N] [--threads T]
                        [--products N] [--data-dir D]

The store (catalog, goals, search index) is loaded once in the master process, before the
workers fork (``preload_app``), so every worker shares it copy-on-write; ``gc.freeze()``
keeps the collector from dirtying those shared pages (measured: PSS under load 90 MB with it,
109 MB and growing without). Workers are gunicorn ``gthread`` workers: ``--workers``
processes (default one per CPU) of ``--threads`` threads (default 4; on 2 CPUs 2 x 4 gave the
most requests/s in ``benchmarks/webshop_load.py``).

The site is stateless (a session is its URL: ``/fixed_<i>`` is goal ``i``), so memory does
not grow with the number of sessions. ``GET /healthz`` answers
``{"status": "ok", "products": N, "goals": M}`` once the server is up.

SIGTERM stops it gracefully (in-flight requests finish, at most ``GRACEFUL_TIMEOUT`` s), SIGINT
at once; both exit 0. The port defaults to ``$WEBSHOP_PORT``, else 3000, so a container can
be moved to another port without changing its command.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 3000
DEFAULT_THREADS = 4
#: seconds a worker may take for one request before gunicorn restarts it
WORKER_TIMEOUT = 60
#: seconds SIGTERM waits for in-flight requests
GRACEFUL_TIMEOUT = 5

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
    threads: int = DEFAULT_THREADS
    products: int | None = None
    data_dir: str | None = None
    log_level: str = "info"
    access_log: bool = False

    def check(self) -> None:
        """ValueError with a one-line reason for options that cannot work."""
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")
        if self.products is not None and self.products < 1:
            raise ValueError(f"--products must be >= 1, got {self.products}")
        if self.data_dir is not None and not os.path.isdir(self.data_dir):
            raise ValueError(f"--data-dir {self.data_dir!r} is not a directory")

    @property
    def bind(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"


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
            server.log.info("envrl webshop: %s; serving at http://%s (%d workers x %d threads)",
                            banner, _address(listener), options.workers, options.threads)

    return {
        "bind": [options.bind],
        "workers": options.workers,
        "worker_class": "gthread",
        "threads": options.threads,
        "preload_app": True,
        "timeout": WORKER_TIMEOUT,
        "graceful_timeout": GRACEFUL_TIMEOUT,
        "keepalive": 5,
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


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ServeOptions", "build_site", "default_port", "default_workers",
           "gunicorn_settings", "serve"]
