"""Worker processes: how envrl starts them, talks to them and reports what went wrong in them.

envrl starts its workers (evaluation runs, vector envs) with ``forkserver`` where available,
else ``spawn``, so that they are safe next to threads. Both start methods have a trap: a
forkserver child inherits the environment variables of the *server*, which was frozen the
first time any pool started; a spawn child inherits them at start. A program that sets
``ALFWORLD_DATA`` (or ``ENVRL_CACHE``) between two runs would silently get workers that
read the old data. So every worker is handed a snapshot of ``os.environ`` taken when its
pool is created, and applies it before building anything.

What goes wrong in a worker reaches the caller as text (an info's ``error``, a record, a log
line), so exceptions are described in one bounded line (:func:`describe_exception`), and a
worker's end in words (:func:`exit_reason`, :attr:`WorkerProcess.reason`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

#: longest one-line error message put in an info or a record: a message can be a whole page
#: (an engine's dump, a server's HTML), and it is repeated in every batch and record it reaches
MAX_ERROR_LENGTH = 500

#: seconds :meth:`WorkerProcess.kill` waits for a killed worker to be reaped
REAP_TIMEOUT = 10.0


def start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn`` (never plain ``fork``)."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def environment_snapshot() -> dict[str, str]:
    """The caller's environment variables, to hand to a worker at start."""
    return dict(os.environ)


def apply_environment(snapshot: Mapping[str, str]) -> None:
    """Make this (worker) process's environment exactly ``snapshot``."""
    for key in set(os.environ) - set(snapshot):
        del os.environ[key]
    os.environ.update(snapshot)


def exit_reason(exitcode: int | None) -> str:
    """A worker's ``Process.exitcode`` in words, for messages ("killed by signal SIGKILL")."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def describe_exception(exc: BaseException, limit: int = MAX_ERROR_LENGTH) -> str:
    """``exc`` as ``"TypeName: message"`` on one line, at most ``limit`` characters.

    Whitespace runs (newlines included) become one space, so the text fits a log line or a
    table cell; an exception without a message is described by its ``repr``.
    """
    text = " ".join(str(exc).split()) or repr(exc)
    text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class WorkerProcess:
    """The caller's handle on one worker process, reached over a duplex pipe of its own.

    ``target(conn, *args)`` runs in the new process, ``conn`` being its end of the pipe. One
    pipe per worker, so a worker that dies mid-message cannot corrupt the others' traffic.
    The caller sends with :meth:`send`, reads with :meth:`receive`, and waits on :attr:`conn`
    (a message) and :attr:`sentinel` (the process ended) together with
    ``multiprocessing.connection.wait``. Messages must not be None (None means "nothing").

    :meth:`kill` ends the worker and its process group: a worker that put itself in a group
    of its own (``os.setpgid(0, 0)``) takes whatever it started (a JVM, say) with it. Either
    way it is reaped, so no zombie is left, and :attr:`reason` says why it ended.
    """

    def __init__(
        self, ctx: BaseContext, target: Callable[..., Any], args: Sequence[Any] = (), *, name: str = "envrl-worker"
    ) -> None:
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        # typeshed declares Process only on the concrete contexts, and get_context(str) gives
        # BaseContext; every context multiprocessing returns has it
        self.process: BaseProcess = ctx.Process(  # type: ignore[attr-defined]
            target=target, args=(child_conn, *args), name=name
        )
        self.process.start()
        child_conn.close()  # only the worker holds its end now: reads here see EOF when it dies
        self.conn = parent_conn
        #: why the caller killed the worker (overrides its exit status in :attr:`reason`)
        self.kill_reason: str | None = None
        #: True once a read found the pipe closed (the worker is gone or going)
        self.disconnected = False
        self._signalled = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def sentinel(self) -> int:
        """Ready (for ``multiprocessing.connection.wait``) once the process has ended."""
        return self.process.sentinel

    @property
    def closed(self) -> bool:
        """True once the caller's end of the pipe is closed (after :meth:`kill`)."""
        return self.conn.closed

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def send(self, message: Any) -> bool:
        """Send ``message`` to the worker; False when it cannot be delivered (the worker is gone)."""
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionError, OSError):
            return False
        return True

    def receive(self) -> Any | None:
        """The worker's next message if one has arrived, else None (at once, never blocking).

        None also once the pipe is closed; :attr:`disconnected` then tells the two apart.
        """
        if self.conn.closed:
            self.disconnected = True
            return None
        try:
            if self.conn.poll():
                return self.conn.recv()
        except (EOFError, OSError):
            self.disconnected = True
        return None

    def wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: for ever) for the process to end; True if it has."""
        return bool(multiprocessing.connection.wait([self.process.sentinel], timeout=timeout))

    def kill(self, reason: str | None = None) -> str:
        """SIGKILL the worker and its process group (once), reap it, close the pipe; returns
        :attr:`reason`. The first ``reason`` given is kept; calling again only reads it."""
        if reason and self.kill_reason is None:
            self.kill_reason = reason
        pid = self.process.pid
        if pid is not None and not self._signalled:
            self._signalled = True
            for kill in (os.killpg, os.kill):  # the group first: nothing it started survives it
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.process.join(timeout=REAP_TIMEOUT)
        self.conn.close()
        return self.reason

    @property
    def reason(self) -> str:
        """Why the worker ended: the reason given to :meth:`kill`, else its exit status in words."""
        return self.kill_reason or exit_reason(self.process.exitcode)
