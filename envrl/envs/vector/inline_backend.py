"""The in-process back end: every env of the vector lives in the caller's own process.

For envs whose step costs microseconds (the diagnostics, docs/diagnostics.md), a worker process
per env costs more than the env: starting 32 workers took ~24 s on 2 cores, and each step pays
a pipe round trip. Here ``_send`` only queues the request and ``_gather`` runs the queued
requests one after another, so a batch is a plain loop over the envs.

What the other back ends give and this one cannot: isolation (an env that crashes the
interpreter takes the caller with it) and the ``timeout`` (a request cannot be interrupted, so
``timeout`` is refused rather than silently ignored). An env that *raises* is handled as in
the other back ends: its env is rebuilt and the episode reported lost (see
:mod:`envrl.envs.vector`). Engines that must not share a process's threads run correctly here
too, since nothing runs in parallel.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from envrl.envs.vector.base import DEFAULT_START_TIMEOUT, EnvHost, Reply, TextVectorEnv
from envrl.processes import describe_exception


class InlineVectorEnv(TextVectorEnv):
    """All envs in this process, stepped in turn (see the module docstring)."""

    backend = "inline"

    def __init__(
        self,
        gym_id: str,
        num_envs: int,
        env_kwargs: Mapping[str, Any],
        *,
        timeout: float | None = None,
        start_timeout: float | None = DEFAULT_START_TIMEOUT,
        autoreset: bool = True,
    ) -> None:
        if timeout is not None:
            raise ValueError(
                "the inline back end cannot interrupt a step, so it takes no timeout "
                "(timeout=None; in a training config rollout.step_timeout: null), or use backend='subprocess'"
            )
        super().__init__(gym_id, num_envs, env_kwargs, timeout=None, start_timeout=start_timeout, autoreset=autoreset)
        self._hosts: list[EnvHost | None] = [None] * self.num_envs
        self._build_errors: dict[int, BaseException] = {}
        self._pending: dict[int, tuple[str, tuple[Any, ...]]] = {}
        self._start_all()

    def _launch(self, index: int) -> None:
        self._kill(index)
        self._build_errors.pop(index, None)
        try:
            self._hosts[index] = EnvHost(self.gym_id, self.env_kwargs, self.autoreset)
        except Exception as exc:  # reported by the first request, as a worker would
            self._build_errors[index] = exc

    def _send(self, index: int, command: str, *args: Any) -> None:
        self._pending[index] = (command, args)

    def _gather(self, indices: Sequence[int], timeout: float | None) -> dict[int, Reply]:
        return {i: self._run(i, *self._pending.pop(i)) for i in indices}

    def _run(self, index: int, command: str, args: tuple[Any, ...]) -> Reply:
        host = self._hosts[index]
        if host is None:
            exc = self._build_errors.get(index)
            if exc is None:
                return Reply("dead", message="the env was closed")
            return Reply("error", exc, message=describe_exception(exc), remote_traceback=_trace(exc))
        try:  # a copy, as a worker's pickled answer is: the caller never shares the env's own dicts
            return Reply("ok", copy.deepcopy(getattr(host, command)(*args)))
        except Exception as exc:
            return Reply("error", exc, message=describe_exception(exc), remote_traceback=_trace(exc))

    def _kill(self, index: int) -> None:
        host, self._hosts[index] = self._hosts[index], None
        if host is not None:
            try:
                host.close()
            except Exception:
                pass

    def _close_workers(self, timeout: float) -> None:
        for index in range(self.num_envs):
            self._kill(index)
        self._pending.clear()


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))
