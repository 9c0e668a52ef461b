"""Any envrl env served over HTTP with the OpenEnv protocol (``openenv-core``), one env per client.

    python -m envrl.integrations.openenv --env textworld --split valid --port 8000 \\
        --env-arg families='["custom"]' [--max-sessions 8] [--idle-timeout 600]

OpenEnv keeps an episode in a WebSocket session: a client (:class:`EnvrlEnvClient`, a subclass of
OpenEnv's own ``EnvClient``) connects to ``/ws`` and sends ``reset``/``step``/``state`` messages;
OpenEnv's ``HTTPEnvServer`` calls the factory once per connection, so every client gets its own
envrl env (``gym.make`` with the server's split and keyword arguments, made on the first reset),
and closes it when the client disconnects. The server is OpenEnv's, unchanged; this module gives
it the types and the environment:

* :class:`EnvrlAction` ``{"text": ...}``: the action string, passed to ``env.step`` as is, so any
  text the env cannot use gets the env's own feedback (``info["valid_action"] = False``), and a
  step after the episode ended gets its "The episode is over; ..." observation with reward 0.
* :class:`EnvrlObservation`: ``text`` (the observation), ``info`` (the env's whole ``info`` dict),
  ``terminated`` and ``truncated``; OpenEnv's ``reward`` is the step's reward (None after a
  reset) and ``done`` is ``terminated or truncated``. Observations, rewards and info are those of
  the in-process env, character for character (info goes through JSON: a tuple arrives as a
  list, a NumPy number as a Python number; the envrl envs put neither in ``info``).
* ``reset`` takes envrl's choices of task: ``task_id=...``, ``seed=...`` or ``options={...}``
  (and OpenEnv's ``episode_id``); an unknown argument is an error, not silently dropped.
* :class:`EnvrlState`: the env id and split, the task, the step count and the end flags.

Limits, all OpenEnv's own mechanisms: at most ``max_sessions`` sessions (``ConcurrencyConfig``;
one more connection gets "Server at capacity ..." and is closed), and a session idle for more
than ``idle_timeout`` seconds is closed by OpenEnv's reaper, which releases its env (it looks
every ``max(idle_timeout / 4, 5)`` s); the client's next message then gets an error saying so.
OpenEnv's stateless ``POST /reset`` and ``POST /step`` (a new env per request, closed right
after) cannot play an episode and would build envs outside the session bound, so they answer
409 with a pointer to ``/ws``; ``/health``, ``/schema``, ``/metadata``, ``/state`` and ``/ws`` are
OpenEnv's.

Threads: OpenEnv runs each session's env calls on one thread of their own. ALFWorld's and
TextWorld's engines are not thread-safe (:data:`envrl.envs.SINGLE_THREAD_ENVS`), so their sessions
share one thread (``REQUIRES_SINGLE_THREAD_EXECUTOR``): correct, but steps of different clients
wait for each other. WebShop (a thread-safe shared store) and ScienceWorld (a JVM per env) run in parallel.

Import time: every ``openenv.core`` import runs ``openenv.core.env_server``, which imports the
optional Gradio web interface (~10 s, more than everything else together). That import is
guarded by OpenEnv itself (``except ModuleNotFoundError``), so unless ``ENABLE_WEB_INTERFACE``
is set this module hides it while importing ``openenv.core`` and unhides it right after (a later
import of ``openenv.core.env_server.web_interface`` works as usual).

Versions: the supported ``openenv-core`` range is pinned (:data:`OPENENV_VERSIONS`) and checked
when this module is imported, with a message naming the extra to install.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

import envrl.envs as envrl_envs
from envrl.integrations.versions import check_version, installed_version
from envrl.ports import check_port, port_argument

#: openenv-core releases this adapter is tested with: at least the first, below the second
OPENENV_VERSIONS = ("0.3.0", "0.4.0")

#: defaults of the server's limits
DEFAULT_MAX_SESSIONS = 8
DEFAULT_IDLE_TIMEOUT = 600.0

_WEB_INTERFACE = "openenv.core.env_server.web_interface"


def check_openenv_version(installed: str | None) -> str:
    """``installed`` (openenv-core's version, None when it is missing) if this adapter supports it,
    else an ImportError saying what to install (:func:`envrl.integrations.versions.check_version`)."""
    return check_version(
        installed, OPENENV_VERSIONS, user=__name__, label="openenv-core", distribution="openenv-core", extra="openenv"
    )


def _import_openenv_core() -> None:
    """Import ``openenv.core`` without its optional Gradio web interface (see the module docstring)."""
    if "openenv.core" in sys.modules or _WEB_INTERFACE in sys.modules:
        return
    if os.environ.get("ENABLE_WEB_INTERFACE", "").lower() in ("true", "1", "yes"):
        return
    sys.modules[_WEB_INTERFACE] = None  # type: ignore[assignment]  # import raises ModuleNotFoundError
    try:
        import openenv.core  # noqa: F401
    except ImportError:  # a release that needs it after all: import it the normal way
        for name in [m for m in sys.modules if m == "openenv.core" or m.startswith("openenv.core.")]:
            del sys.modules[name]
    finally:
        if sys.modules.get(_WEB_INTERFACE, 0) is None:
            del sys.modules[_WEB_INTERFACE]


check_openenv_version(installed_version("openenv-core"))
_import_openenv_core()

from fastapi import FastAPI  # noqa: E402  (after the version check: a clear message first)
from fastapi.responses import JSONResponse  # noqa: E402
from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_client import EnvClient  # noqa: E402
from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import (  # noqa: E402
    Action,
    ConcurrencyConfig,
    EnvironmentMetadata,
    Observation,
    State,
)
from pydantic import Field  # noqa: E402
from starlette.websockets import WebSocketDisconnect  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

log = logging.getLogger(__name__)


# ---- the wire types ------------------------------------------------------------------------


class EnvrlAction(Action):
    """One text action, e.g. ``EnvrlAction(text="go east")`` or ``EnvrlAction(text="click[buy now]")``."""

    text: str = Field(description="the action, passed to the env as is (any text; the env answers what it cannot use)")


class EnvrlObservation(Observation):
    """What ``reset``/``step`` return: the env's observation, info and end flags (``reward``/``done``
    are OpenEnv's fields: the step's reward, None after a reset, and ``terminated or truncated``)."""

    text: str = Field(default="", description="the env's observation")
    info: dict[str, Any] = Field(
        default_factory=dict, description="the env's info dict (task_id, admissible_actions, ...)"
    )
    terminated: bool = Field(default=False, description="the task ended (won, bought, failed)")
    truncated: bool = Field(default=False, description="the step limit ended the episode")


class EnvrlState(State):
    """The session's env and episode (``step_count``: the env's ``info["step"]``)."""

    env_id: str = Field(default="", description="the Gymnasium id, e.g. envrl/TextWorld-v0")
    split: str = Field(default="", description="the split the server plays")
    task_id: str | None = Field(default=None, description="the running episode's task, None before the first reset")
    terminated: bool = False
    truncated: bool = False


# ---- the environment -----------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """``value`` as JSON carries it: mappings with text keys, lists for tuples, Python numbers for
    NumPy ones, text for anything else. The envrl envs' info is JSON already (unchanged here)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if hasattr(value, "tolist"):  # NumPy scalars and arrays
        return jsonable(value.tolist())
    return str(value)


class EnvrlEnvironment(Environment[EnvrlAction, EnvrlObservation, EnvrlState]):
    """An OpenEnv ``Environment`` playing one envrl env (made on the first reset, closed by ``close``).

    OpenEnv also calls the factory for its stateless ``GET /state`` and ``/metadata``; making the
    env lazily keeps those from building engines (a ScienceWorld JVM) per request.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        env: str,
        split: str,
        env_kwargs: Mapping[str, Any] | None = None,
        idle_timeout: float | None = None,
    ):
        super().__init__()
        self.env_id = envrl_envs.env_id(env)
        self.split = split
        self.env_kwargs = dict(env_kwargs or {})
        self.idle_timeout = idle_timeout
        self._env: gym.Env | None = None
        self._closed = False
        self._state = EnvrlState(env_id=self.env_id, split=split)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        options: dict[str, Any] | None = None,
        **unknown: Any,
    ) -> EnvrlObservation:
        if unknown:
            names = ", ".join(sorted(unknown))
            raise ValueError(f"unknown reset argument(s): {names}; reset takes task_id, seed, options and episode_id")
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict such as {{'task_id': ...}}, got {type(options).__name__}")
        options = dict(options or {})
        if task_id is not None:
            if options.get("task_id") not in (None, task_id):
                raise ValueError(f"two task ids: task_id={task_id!r} and options['task_id']={options['task_id']!r}")
            options["task_id"] = task_id
        env = self._open_env()
        observation, info = env.reset(seed=seed, options=options or None)
        self._state = EnvrlState(
            episode_id=episode_id or uuid.uuid4().hex,
            step_count=int(info.get("step", 0)),
            env_id=self.env_id,
            split=self.split,
            task_id=info.get("task_id"),
        )
        return EnvrlObservation(text=observation, info=jsonable(info), reward=None, done=False)

    def step(self, action: EnvrlAction, timeout_s: float | None = None, **kwargs: Any) -> EnvrlObservation:
        if self._env is None:
            self._check_open()
            raise RuntimeError("no episode is running: call reset() (e.g. reset(task_id=...) or reset(seed=...)) first")
        self._check_open()
        observation, reward, terminated, truncated, info = self._env.step(action.text)
        self._state.step_count = int(info.get("step", self._state.step_count + 1))
        self._state.terminated, self._state.truncated = bool(terminated), bool(truncated)
        return EnvrlObservation(
            text=observation,
            info=jsonable(info),
            reward=float(reward),
            done=bool(terminated or truncated),
            terminated=bool(terminated),
            truncated=bool(truncated),
        )

    @property
    def state(self) -> EnvrlState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        from envrl import __version__

        return EnvironmentMetadata(
            name=self.env_id,
            description=f"envrl's {self.env_id}, split {self.split!r}: text observations, text actions",
            version=__version__,
        )

    def close(self) -> None:
        self._closed = True
        env, self._env = self._env, None
        if env is not None:
            env.close()

    def _open_env(self) -> gym.Env:
        self._check_open()
        if self._env is None:
            self._env = gym.make(self.env_id, split=self.split, **self.env_kwargs)
        return self._env

    def _check_open(self) -> None:
        if self._closed:
            idle = f"idle for more than {self.idle_timeout:g} s, or " if self.idle_timeout else ""
            raise RuntimeError(f"this session's env was closed ({idle}the server is stopping); connect again")


class SharedThreadEnvrlEnvironment(EnvrlEnvironment):
    """For engines that are not thread-safe: OpenEnv runs every session of this class on one thread."""

    REQUIRES_SINGLE_THREAD_EXECUTOR = True


# ---- the server ----------------------------------------------------------------------------


def build_app(
    env: str,
    split: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    check: bool = True,
) -> FastAPI:
    """The OpenEnv FastAPI app serving ``gym.make(env, split=split, **env_kwargs)``, one env per session.

    ``env``: a short name (``textworld``) or an id. ``max_sessions`` >= 1; ``idle_timeout``
    seconds > 0, or None for no timeout. ``check`` makes (and closes) one env first, so a bad
    split or keyword fails here, in one line, instead of at every client's first reset.
    """
    env_id = envrl_envs.env_id(env)
    name = envrl_envs.env_name(env_id)
    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an integer >= 1, got {max_sessions!r}")
    if idle_timeout is not None and not idle_timeout > 0:
        raise ValueError(f"idle_timeout must be > 0 seconds (or None for none), got {idle_timeout!r}")
    kwargs = dict(env_kwargs or {})
    if "split" in kwargs:
        raise ValueError("give the split as split=..., not in env_kwargs")
    if check:
        gym.make(env_id, split=split, **kwargs).close()
    cls = SharedThreadEnvrlEnvironment if name in envrl_envs.SINGLE_THREAD_ENVS else EnvrlEnvironment
    # a partial of the class: OpenEnv reads the class flags through ``.func``, and names the factory in errors
    factory = functools.partial(cls, env_id, split, kwargs, idle_timeout)
    factory.__name__ = f"{cls.__name__}({env_id!r}, split={split!r})"  # type: ignore[attr-defined]
    app = create_fastapi_app(
        factory,
        EnvrlAction,
        EnvrlObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_timeout),
    )
    app.title = f"envrl {env_id} ({split}) over OpenEnv"
    _replace_stateless_routes(app)
    app.add_middleware(_QuietDisconnects)
    return app


class _QuietDisconnects:
    """Drops the ``WebSocketDisconnect`` that OpenEnv's ``/ws`` handler raises when a client has left
    first: the handler has already released the session (its ``finally`` closes the env, then calls
    ``websocket.close()``, which Starlette 1.x answers with this exception where OpenEnv expects a
    RuntimeError), so all it would add is a traceback in the log at every disconnect."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            pass


def _replace_stateless_routes(app: FastAPI) -> None:
    """``POST /reset`` and ``/step`` answer 409 pointing to ``/ws`` (see the module docstring)."""
    app.router.routes[:] = [
        route
        for route in app.router.routes
        if not (getattr(route, "path", None) in ("/reset", "/step") and "POST" in getattr(route, "methods", ()))
    ]
    message = (
        "envrl episodes live in WebSocket sessions: connect to /ws with an OpenEnv client "
        "(envrl.integrations.openenv.EnvrlEnvClient); stateless /reset and /step are not served"
    )

    async def stateless(_: dict[str, Any] | None = None) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": message})

    for path in ("/reset", "/step"):
        app.post(path, status_code=409, tags=["Environment Control"], summary="Not served: use /ws")(stateless)


def serve(
    env: str,
    split: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
    log_level: str = "warning",
) -> int:
    """Serve until SIGINT/SIGTERM (0); 1 when the port cannot be bound or the env cannot be made
    (the reason in one line on stderr). The port is bound first, so a busy one fails at once; one
    line with the URL is printed once the server accepts connections (``port=0``: a free port)."""
    import uvicorn

    try:
        check_port(port)
    except ValueError as exc:
        print(f"envrl: bad port: {exc}", file=sys.stderr)
        return 1
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        print(f"envrl: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        app = build_app(env, split, env_kwargs, max_sessions=max_sessions, idle_timeout=idle_timeout)
    except Exception as exc:  # a bad env, split or keyword: one line, not a traceback
        sock.close()
        print(f"envrl: cannot serve {env} (split {split!r}): {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    bound_host, bound_port = sock.getsockname()[:2]
    url_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    idle = f"{idle_timeout:g} s" if idle_timeout else "none"

    async def announce() -> None:
        print(
            f"envrl: serving {envrl_envs.env_id(env)} (split {split}) over OpenEnv at http://{url_host}:{bound_port} "
            f"(WebSocket /ws; at most {max_sessions} sessions, idle timeout {idle})",
            flush=True,
        )

    app.router.on_startup.append(announce)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5))
    # uvicorn shuts down gracefully on SIGINT/SIGTERM and then re-raises the signal: make that an
    # exception here, so the caller gets its exit code 0 rather than a traceback or a killed process
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread: the caller handles signals
        pass
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


# ---- the command line ----------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _idle_timeout(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seconds (or 0 for no timeout), got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be seconds >= 0 (0: no timeout), got {text!r}")
    return value or None


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The options of ``python -m envrl.integrations.openenv`` (and ``envrl serve-env``)."""
    parser = argparse.ArgumentParser(
        prog=prog or "python -m envrl.integrations.openenv",
        description="Serve an envrl env over the OpenEnv protocol (WebSocket /ws), one env per client.",
    )
    parser.add_argument("--env", required=True, choices=sorted(envrl_envs.ENV_IDS), help="the env family")
    parser.add_argument("--split", required=True, help="the split every session plays (e.g. valid)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port_argument, default=8000, help="port (default 8000; 0: any free port)")
    parser.add_argument(
        "--max-sessions",
        type=_positive_int,
        default=DEFAULT_MAX_SESSIONS,
        help=f"clients served at once, one env each (default {DEFAULT_MAX_SESSIONS})",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_idle_timeout,
        default=DEFAULT_IDLE_TIMEOUT,
        help=f"seconds after which an idle session is closed and its env released "
        f"(default {DEFAULT_IDLE_TIMEOUT:g}; 0: never)",
    )
    parser.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    envrl_envs.add_env_arg_option(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Parse ``argv`` and serve (see :func:`serve` for the exit codes; 2 for bad arguments)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        env_kwargs = envrl_envs.parse_env_args(args.env_arg)
    except ValueError as exc:
        parser.error(str(exc))
    return serve(
        args.env,
        args.split,
        env_kwargs,
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        idle_timeout=args.idle_timeout,
        log_level=args.log_level,
    )


# ---- the client ----------------------------------------------------------------------------


#: error codes after which OpenEnv's server closes the connection (no session was made)
SESSION_REFUSED = frozenset({"CAPACITY_REACHED", "FACTORY_ERROR", "SESSION_ERROR"})


class ServerError(RuntimeError):
    """An error the server answered (``code``: OpenEnv's ``WSErrorCode`` value, e.g. ``CAPACITY_REACHED``,
    ``EXECUTION_ERROR`` for an exception of the env, ``VALIDATION_ERROR`` for a malformed action)."""

    def __init__(self, message: str, code: str):
        super().__init__(f"Server error: {message} (code: {code})")
        self.message, self.code = message, code

    @classmethod
    def from_response(cls, response: Mapping[str, Any]) -> ServerError:
        data = response.get("data") if response.get("type") == "error" else None
        if not isinstance(data, Mapping):
            return cls(f"unexpected answer {str(response)[:200]}", "UNKNOWN")
        message = str(data.get("message", "unknown error"))
        errors = data.get("errors")
        if isinstance(errors, list) and errors:  # a malformed message: say which field and why
            details = (
                f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in errors[:3] if isinstance(e, dict)
            )
            message = f"{message}: {'; '.join(details)}"
        return cls(message, str(data.get("code", "UNKNOWN")))


class EnvrlEnvClient(EnvClient[EnvrlAction, EnvrlObservation, EnvrlState]):
    """OpenEnv's WebSocket client for an envrl server; ``step`` takes an :class:`EnvrlAction` or a string.

    with EnvrlEnvClient(base_url="http://127.0.0.1:8000").sync() as client:
        result = client.reset(task_id="tw-custom:valid:0")
        result = client.step("go east")
        result.observation.text, result.reward, result.done, result.observation.info
    """

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        """OpenEnv's exchange, with every server error raised as :class:`ServerError` (a RuntimeError,
        as OpenEnv's client raises). A server at capacity sends its error and closes at once, so a
        send can find the connection closed with the reason still unread: it is read and raised."""
        try:
            await self._send(message)
            response = await self._receive()
        except ConnectionClosed as closed:
            error = await self._unread_error()
            self._ws = None  # the next call connects again (e.g. once a session is free)
            if error is None:
                raise ServerError(f"the server closed the connection ({closed})", "CONNECTION_CLOSED") from closed
            raise error from closed
        if response.get("type") == "error":
            error = ServerError.from_response(response)
            if error.code in SESSION_REFUSED:  # the server has closed this connection
                await self.disconnect()
            raise error
        return response

    async def _unread_error(self) -> ServerError | None:
        """The error the server sent before closing, if one is waiting."""
        connection: Any = self._ws
        if connection is None:
            return None
        try:
            response = json.loads(await asyncio.wait_for(connection.recv(), timeout=1.0))
        except Exception:  # nothing waiting, or not JSON: no reason to add
            return None
        return ServerError.from_response(response) if isinstance(response, dict) else None

    def _step_payload(self, action: EnvrlAction | str | Mapping[str, Any]) -> dict[str, Any]:
        if isinstance(action, str):
            return EnvrlAction(text=action).model_dump()
        if isinstance(action, Mapping):  # a raw payload, as OpenEnv's generic client sends it
            return dict(action)
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EnvrlObservation]:
        observation = EnvrlObservation.model_validate(
            {**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)}
        )
        return StepResult(observation=observation, reward=observation.reward, done=observation.done)

    def _parse_state(self, payload: dict[str, Any]) -> EnvrlState:
        return EnvrlState.model_validate(payload)


if __name__ == "__main__":
    sys.exit(main())
