"""Connecting to Ray, for everything in envrl that runs on Ray actors (vector envs, evaluation runs).

Ray is optional: it is imported only when one of these functions needs it, and
:func:`connect_ray` says how to install it when it is missing.

Which Ray instance
    ``address``: ``None`` uses the instance this process is already connected to, else
    behaves like ``"auto"``; ``"auto"`` connects to a running cluster (``$RAY_ADDRESS``, or
    one started with ``ray start`` on this machine) and starts a local instance when there
    is none; ``"local"`` always starts a new local instance; anything else
    (``"10.0.0.5:6379"``, ``"ray://head:10001"``) is a cluster to connect to. With
    ``$RAY_ADDRESS`` set, ``"auto"`` connects there or fails (it starts nothing here).
    An instance envrl started is shut down when its last user (a vector env, an evaluation
    run) releases it; one it did not start is never shut down.

Environment variables
    Ray starts actors with the environment of the node's raylet, not the caller's, so the
    caller's variables that steer envrl and its engines (:data:`FORWARDED_PREFIXES`:
    ``ALFWORLD_DATA``, ``WEBSHOP_DATA``, ``ENVRL_*``, ...) are handed to each actor at start
    (:func:`forwarded_environment`) and made exactly the caller's there, set or unset
    (:func:`apply_forwarded_environment`). Nothing else is forwarded: paths like ``HOME`` or
    ``PATH`` belong to the node.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("envrl.ray")

#: CPUs each envrl actor asks Ray for: a text env (or an episode player) spends most of its
#: time waiting for the agent, so two actors share a core by default
DEFAULT_NUM_CPUS = 0.5

#: variables (names, or prefixes ending in ``_``) copied from the caller into every actor
FORWARDED_PREFIXES = (
    "ENVRL_",
    "ALFWORLD_",
    "WEBSHOP_",
    "SCIENCEWORLD_",
    "TEXTWORLD_",
    "HF_",
    "OPENAI_",
    "JAVA_TOOL_OPTIONS",
    "PYTHONHASHSEED",
)

#: seconds to wait for a cluster's port to answer before giving up on it
REACHABLE_TIMEOUT = 10.0


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


# ---- the connection, shared by every user in this process -------------------------------

_session_lock = threading.Lock()
_started_here = False  # this process started the Ray instance it is connected to
_users = 0  # vector envs and evaluation runs holding that instance


def connect_ray(address: str | None = None, init_kwargs: Mapping[str, Any] | None = None) -> bool:
    """Connect this process to Ray (see the module docstring for ``address``); ``init_kwargs``
    go to ``ray.init`` when this call connects.

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
            check_reachable(address)
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


def check_reachable(address: str, timeout: float = REACHABLE_TIMEOUT) -> None:
    """Fail fast on a ``[ray://]host:port`` that nothing answers on (Ray itself retries for
    minutes)."""
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


# ---- actors -------------------------------------------------------------------------------


def kill_actor(actor: Any) -> None:
    """``ray.kill`` that never raises (the actor may be gone already, or Ray shut down)."""
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:
        pass


_remote_classes: dict[type, Any] = {}


def remote_class(cls: type) -> Any:
    """``ray.remote(cls)``, made once per class (Ray exports a class each time it wraps it)."""
    import ray

    if cls not in _remote_classes:
        _remote_classes[cls] = ray.remote(cls)
    return _remote_classes[cls]
