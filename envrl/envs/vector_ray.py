"""The Ray back end of :mod:`envrl.envs.vector`: one Ray actor per env, anywhere on a cluster.

    vec = make_vec("alfworld", 64, backend="ray", ray_address="auto", split="train")

Same semantics as the subprocess back end (batches, seeds, same-step autoreset, a lost
worker replaced without touching the other envs' episodes); a "worker" is an actor here.
An actor that dies (``ray.kill``, its process or node lost) or does not answer within
``timeout`` seconds (it is then killed) is replaced by a new actor.

Which Ray instance
    ``ray_address``: ``None`` uses the instance this process is already connected to, else
    behaves like ``"auto"``; ``"auto"`` connects to a running cluster (``$RAY_ADDRESS``, or
    one started with ``ray start`` on this machine) and starts a local instance when there
    is none; ``"local"`` always starts a new local instance; anything else
    (``"10.0.0.5:6379"``, ``"ray://head:10001"``) is a cluster to connect to. With
    ``$RAY_ADDRESS`` set, ``"auto"`` connects there or fails (it starts nothing here).
    An instance envrl started is shut down when the last vector env (or evaluation run) using
    it closes; one it did not start is never shut down.

Resources
    Each actor asks for ``num_cpus`` CPUs (default :data:`DEFAULT_NUM_CPUS`): a text env
    spends most of its time waiting for the agent, so two actors share a core by default.
    Every node must have envrl (and the engines) installed, as for any Ray code.

Environment variables
    Ray starts actors with the environment of the node's raylet, not the caller's, so the
    caller's variables that steer envrl and its engines (:data:`FORWARDED_PREFIXES`:
    ``ALFWORLD_DATA``, ``WEBSHOP_DATA``, ``ENVRL_*``, ...) are handed to each actor at start
    and made exactly the caller's there (set or unset). Nothing else is forwarded: paths like
    ``HOME`` or ``PATH`` belong to the node.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from envrl.envs.vector import DEFAULT_START_TIMEOUT, EnvHost, TextVectorEnv, _describe_exception, _Reply

logger = logging.getLogger("envrl.vector")

#: CPUs each actor asks Ray for
DEFAULT_NUM_CPUS = 0.5

#: variables (names, or prefixes ending in ``_``) copied from the caller into every actor
FORWARDED_PREFIXES = ("ENVRL_", "ALFWORLD_", "WEBSHOP_", "SCIENCEWORLD_", "TEXTWORLD_", "HF_", "OPENAI_",
                      "JAVA_TOOL_OPTIONS", "PYTHONHASHSEED")


def _forwarded(name: str) -> bool:
    return any(name.startswith(p) if p.endswith("_") else name == p for p in FORWARDED_PREFIXES)


def forwarded_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's variables that actors get (see :data:`FORWARDED_PREFIXES`)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if _forwarded(k)}


def apply_forwarded_environment(snapshot: Mapping[str, str]) -> None:
    """In an actor: make the forwarded variables exactly ``snapshot`` (others untouched)."""
    for key in [k for k in os.environ if _forwarded(k) and k not in snapshot]:
        del os.environ[key]
    os.environ.update(snapshot)


# ---- connecting to Ray -------------------------------------------------------------------

_session_lock = threading.Lock()
_started_here = False  # this process started the Ray instance it is connected to
_users = 0  # vector envs and evaluation runs holding that instance


def connect_ray(address: str | None = None, init_kwargs: Mapping[str, Any] | None = None) -> bool:
    """Connect this process to Ray (see the module docstring for ``address``).

    Returns True when the instance is one envrl started: pass the result to
    :func:`release_ray` when done, which shuts it down after its last user.
    """
    global _started_here, _users
    try:
        import ray
    except ImportError as exc:
        raise ImportError("the Ray back end needs Ray: pip install 'envrl[ray]' (or 'ray>=2.9')") from exc
    kwargs = dict(init_kwargs or {})
    with _session_lock:
        if ray.is_initialized():
            if address not in (None, "auto"):
                logger.info("already connected to Ray; ignoring address %r", address)
            if _started_here:
                _users += 1
            return _started_here
        _started_here, _users = False, 0
        if address not in (None, "auto", "local"):
            _check_reachable(address)
            ray.init(address=address, **kwargs)
            return False
        if address != "local":
            try:
                ray.init(address="auto", **kwargs)
                return False
            except ConnectionError:
                if os.environ.get("RAY_ADDRESS"):
                    raise  # a cluster was named and cannot be reached: no silent local instance
                # no running cluster: start one here
        kwargs.setdefault("include_dashboard", False)
        ray.init(address="local", **kwargs)
        _started_here, _users = True, 1
        return True


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a ``[ray://]host:port`` that nothing answers on (Ray itself retries for
    minutes)."""
    import socket

    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return  # not host:port: let Ray judge it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {address} ({exc.strerror or exc}); is the Ray cluster up?") from exc


def release_ray(started_here: bool) -> None:
    """Give back what :func:`connect_ray` returned; the last user of an instance envrl
    started shuts it down."""
    global _started_here, _users
    if not started_here:
        return
    import ray

    with _session_lock:
        if not _started_here:
            return
        _users -= 1
        if _users <= 0:
            _started_here, _users = False, 0
            if ray.is_initialized():
                ray.shutdown()


# ---- the actor and the vector env ---------------------------------------------------------


def kill_actor(actor: Any) -> None:
    """``ray.kill`` that never raises (the actor may be gone already, or Ray shut down)."""
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:
        pass


class EnvActor(EnvHost):
    """The actor class (wrapped with ``ray.remote`` when first used): one env, as in a worker
    process. An error while building the env is kept and raised by :meth:`describe`, so the
    caller gets the env's own exception (an unknown split, say) rather than a dead actor."""

    def __init__(self, environ: Mapping[str, str], gym_id: str, env_kwargs: Mapping[str, Any]) -> None:
        apply_forwarded_environment(environ)
        self.init_error: Exception | None = None
        try:
            super().__init__(gym_id, env_kwargs)
        except Exception as exc:
            self.init_error = exc
            self.env = None

    def describe(self) -> dict[str, Any]:
        if self.init_error is not None:
            raise self.init_error
        return super().describe()

    def close(self) -> None:
        if self.env is not None:
            super().close()
            self.env = None


_remote_classes: dict[type, Any] = {}


def remote_class(cls: type) -> Any:
    """``ray.remote(cls)``, made once per class."""
    import ray

    if cls not in _remote_classes:
        _remote_classes[cls] = ray.remote(cls)
    return _remote_classes[cls]


def error_reply(exc: BaseException) -> _Reply:
    """A failed Ray call as a reply: the env's exception (``error``) or a lost actor (``dead``)."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):
        cause = getattr(exc, "cause", None) or exc
        return _Reply("error", cause, message=_describe_exception(cause), remote_traceback=str(exc))
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    why = lines[-1] if lines else repr(exc)  # Ray's last line says why (killed, node lost, ...)
    return _Reply("dead", message=f"Ray actor lost ({type(exc).__name__}: {why})"[:500])


class RayVectorEnv(TextVectorEnv):
    """One Ray actor per env; see the module docstrings (here and :mod:`envrl.envs.vector`).

    ``num_cpus``: CPUs per actor (default :data:`DEFAULT_NUM_CPUS`). ``actor_options``: more
    ``.options(...)`` for the actors (``resources``, ``scheduling_strategy``, ``runtime_env``).
    ``ray_init_kwargs``: keyword arguments for ``ray.init`` when this call connects.
    """

    backend = "ray"

    def __init__(self, gym_id: str, num_envs: int, env_kwargs: Mapping[str, Any], *, ray_address: str | None = None,
                 num_cpus: float | None = None, ray_init_kwargs: Mapping[str, Any] | None = None,
                 actor_options: Mapping[str, Any] | None = None, timeout: float | None = None,
                 start_timeout: float | None = DEFAULT_START_TIMEOUT) -> None:
        super().__init__(gym_id, num_envs, env_kwargs, timeout=timeout, start_timeout=start_timeout)
        self.num_cpus = DEFAULT_NUM_CPUS if num_cpus is None else float(num_cpus)
        if self.num_cpus < 0:
            raise ValueError(f"num_cpus must be >= 0, got {num_cpus!r}")
        self._actor_options = {"num_cpus": self.num_cpus, "max_restarts": 0, "max_task_retries": 0,
                               **dict(actor_options or {})}
        self._environ = forwarded_environment()
        self._actors: list[Any] = [None] * self.num_envs
        self._refs: list[Any] = [None] * self.num_envs
        self._owns_ray = connect_ray(ray_address, ray_init_kwargs)
        try:
            self._warn_if_too_few_cpus()
            self._start_all()
        except BaseException:
            release_ray(self._owns_ray)
            raise

    @property
    def actors(self) -> list[Any]:
        """Each env's actor handle (to inspect it, or ``ray.kill`` it in a test)."""
        return list(self._actors)

    def _warn_if_too_few_cpus(self) -> None:
        import ray

        need = self.num_envs * self.num_cpus
        have = ray.cluster_resources().get("CPU", 0.0)
        if need > have:
            logger.warning("%d actors x %g CPUs need %g CPUs but the Ray cluster has %g: some will wait for "
                           "resources (lower num_cpus, or add nodes)", self.num_envs, self.num_cpus, need, have)

    def _launch(self, index: int) -> None:
        self._kill(index)
        actor_class = remote_class(EnvActor).options(**self._actor_options)
        self._actors[index] = actor_class.remote(self._environ, self.gym_id, self.env_kwargs)

    def _send(self, index: int, command: str, *args: Any) -> None:
        self._refs[index] = getattr(self._actors[index], command).remote(*args)

    def _gather(self, indices: Sequence[int], timeout: float | None) -> dict[int, _Reply]:
        import ray

        owners = {self._refs[i]: i for i in indices}
        done, not_done = ray.wait(list(owners), num_returns=len(owners), timeout=timeout)
        replies: dict[int, _Reply] = {}
        for ref in done:
            i = owners[ref]
            try:
                replies[i] = _Reply("ok", ray.get(ref))
            except Exception as exc:
                replies[i] = error_reply(exc)
                if replies[i].kind == "dead":
                    self._kill(i)
        for ref in not_done:
            i = owners[ref]
            self._kill(i)
            replies[i] = _Reply("dead", message=f"no answer within {timeout:g}s, actor killed")
        for i in indices:
            self._refs[i] = None
        return replies

    def _kill(self, index: int) -> None:
        actor = self._actors[index]
        self._actors[index] = None
        if actor is not None:
            kill_actor(actor)

    def _close_workers(self, timeout: float) -> None:
        import ray

        if not ray.is_initialized():  # Ray shut down first (at exit): the actors went with it
            self._actors = [None] * self.num_envs
            return
        refs = []
        for actor in self._actors:
            if actor is not None:
                try:
                    refs.append(actor.close.remote())
                except Exception:
                    pass
        if refs and timeout > 0:
            try:
                ray.wait(refs, num_returns=len(refs), timeout=timeout)
            except Exception:
                pass
        for i in range(self.num_envs):
            self._kill(i)

    def close_extras(self, timeout: float = 5.0, **kwargs: Any) -> None:
        try:
            super().close_extras(timeout=timeout, **kwargs)
        finally:
            release_ray(self._owns_ray)
            self._owns_ray = False
