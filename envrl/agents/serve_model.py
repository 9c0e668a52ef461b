"""An OpenAI-compatible chat server for one transformers checkpoint (``envrl serve-model``).

Why not just vLLM: this one runs anywhere transformers does (CPU included), and it shares
:class:`~envrl.agents.hf.HFBackend` with in-process runs, so a served model renders prompts and
decodes exactly like the in-process one. Only what our agents need is implemented:
``/v1/chat/completions`` without streaming, one choice per request.

Concurrency: HTTP requests are handled on werkzeug threads, but the model is touched by one
generation thread only (:class:`MicroBatcher`). It collects the requests that arrive within
``batch_wait_s`` of the oldest waiting one (while the model is busy, everything that arrives
meanwhile is taken at once), groups those with identical sampling settings, and makes one
``backend.generate`` call per group.

Error policy: every error is a JSON body ``{"error": {"message", "type", "param", "code"}}``
like OpenAI's, never a traceback, and never an echo of the (possibly huge) input.
``max_tokens`` above ``max_new_tokens_limit`` is rejected with 400 rather than clamped, so a
client never silently gets shorter completions than it asked for.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from envrl.agents.generation import Backend, Generation, Message, SamplingConfig

log = logging.getLogger(__name__)

#: roles a chat message may have; "developer" (OpenAI's newer name) is treated as "system"
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: request fields that would change the result if honoured; rejected when set, not ignored
_UNSUPPORTED = ("stop", "tools", "functions", "logit_bias", "response_format")
_MAX_ECHO = 80


class RequestError(Exception):
    """An error that becomes an OpenAI-style JSON response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# ---- micro-batching ----------------------------------------------------------------------


@dataclass
class _Pending:
    messages: list[Message]
    sampling: SamplingConfig
    arrived: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None


class MicroBatcher:
    """Owns the backend: one thread runs every ``generate`` call, batching concurrent requests.

    ``batches`` and ``requests`` count what has been generated (read them for monitoring and
    tests). Sampled requests with a seed run alone: a seeded sample depends on the other
    prompts in its batch, and a client passing a seed expects the same answer every time.
    """

    def __init__(self, backend: Backend, *, max_batch_size: int = 16, batch_wait_s: float = 0.01) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.backend = backend
        self.max_batch_size = max_batch_size
        self.batch_wait_s = max(0.0, batch_wait_s)
        self.batches = 0
        self.requests = 0
        self._pending: list[_Pending] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="envrl-generate", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closed

    def submit(self, messages: list[Message], sampling: SamplingConfig) -> Generation:
        """Queue one prompt and block until its generation is done."""
        item = _Pending(messages, sampling)
        with self._cond:
            if self._closed:
                return _error_generation("server is shutting down")
            self._pending.append(item)
            self._cond.notify_all()
        while not item.done.wait(1.0):
            if not self._thread.is_alive():  # never hang a client on a dead generation thread
                return _error_generation("generation thread stopped")
        return item.result if item.result is not None else _error_generation("no result")

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread after the batch in progress; waiting requests get an error."""
        with self._cond:
            self._closed = True
            left, self._pending = self._pending, []
            self._cond.notify_all()
        for item in left:
            item.result = _error_generation("server is shutting down")
            item.done.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _limit(self, sampling: SamplingConfig) -> int:
        return 1 if sampling.temperature > 0 and sampling.seed is not None else self.max_batch_size

    def _take_batch(self) -> list[_Pending] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            key = self._pending[0].sampling
            limit = self._limit(key)
            deadline = self._pending[0].arrived + self.batch_wait_s
            while not self._closed:
                same = sum(1 for p in self._pending if p.sampling == key)
                remaining = deadline - time.monotonic()
                if same >= limit or remaining <= 0:
                    break
                self._cond.wait(remaining)
            if self._closed:
                return None
            batch = [p for p in self._pending if p.sampling == key][:limit]
            taken = set(map(id, batch))
            self._pending = [p for p in self._pending if id(p) not in taken]
            return batch

    def _loop(self) -> None:
        while (batch := self._take_batch()) is not None:
            sampling = batch[0].sampling
            try:
                results = self.backend.generate([p.messages for p in batch], sampling)
                if len(results) != len(batch):
                    raise RuntimeError(f"backend returned {len(results)} results for {len(batch)} prompts")
            except Exception as exc:  # a broken backend fails this batch, not the server
                log.exception("generation failed")
                results = [_error_generation(f"{type(exc).__name__}: {exc}")] * len(batch)
            self.batches += 1
            self.requests += len(batch)
            for item, gen in zip(batch, results):
                item.result = gen
                item.done.set()


def _error_generation(message: str) -> Generation:
    return Generation(text="", finish_reason="error", error=message[:500])


# ---- request parsing ---------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "..."


def _parse_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "'messages' must be a non-empty array", param="messages")
    messages: list[Message] = []
    for i, message in enumerate(raw):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(400, f"{param} must be an object", param=param)
        role = message.get("role")
        if role not in _ROLES:
            raise RequestError(400, f"{param}.role must be one of {sorted(_ROLES)}", param=f"{param}.role")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text parts are supported
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise RequestError(400, f"{param}.content: only text parts are supported", param=f"{param}.content")
                texts.append(part["text"])
            content = "".join(texts)
        if content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise RequestError(
                400, f"{param}.content must be a string or an array of text parts", param=f"{param}.content"
            )
        messages.append({"role": _ROLES[role], "content": content})
    return messages


def parse_chat_request(
    body: Any, *, model_name: str, max_new_tokens_limit: int
) -> tuple[list[Message], SamplingConfig]:
    """Validate a ``/v1/chat/completions`` body into messages and sampling settings.

    Defaults follow OpenAI: ``temperature`` 1 and ``top_p`` 1 when absent; ``max_tokens``
    defaults to ``max_new_tokens_limit``. Raises :class:`RequestError` on anything invalid.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise RequestError(400, "'model' must be a string", param="model")
    if model != model_name:
        raise RequestError(
            404,
            f"model '{_short(model)}' not found; this server has '{model_name}'",
            param="model",
            code="model_not_found",
        )
    messages = _parse_messages(body.get("messages"))

    if body.get("n") not in (None, 1):
        raise RequestError(400, "only n=1 is supported", param="n")
    if body.get("stream") not in (None, False):
        raise RequestError(400, "streaming is not supported; use stream=false", param="stream")
    if body.get("logprobs") not in (None, False, True):
        raise RequestError(400, "'logprobs' must be a boolean", param="logprobs")
    if body.get("top_logprobs") not in (None, 0):
        raise RequestError(
            400, "'top_logprobs' is not supported (only the sampled tokens' logprobs)", param="top_logprobs"
        )
    for name in _UNSUPPORTED:
        if body.get(name) not in (None, [], ""):
            raise RequestError(400, f"'{name}' is not supported by this server", param=name)
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and (not _is_number(value) or value != 0):
            raise RequestError(400, f"'{name}' is not supported (only 0)", param=name)

    max_tokens = max_new_tokens_limit
    for name in ("max_tokens", "max_completion_tokens"):  # the newer name wins when both are set
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise RequestError(400, f"'{name}' must be a positive integer", param=name)
        if value > max_new_tokens_limit:
            raise RequestError(
                400, f"'{name}' is {value}, above this server's limit of {max_new_tokens_limit}", param=name
            )
        max_tokens = value

    temperature = body.get("temperature", 1.0)
    temperature = 1.0 if temperature is None else temperature
    if not _is_number(temperature) or not 0 <= temperature <= 2:
        raise RequestError(400, "'temperature' must be a number between 0 and 2", param="temperature")
    top_p = body.get("top_p", 1.0)
    top_p = 1.0 if top_p is None else top_p
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise RequestError(400, "'top_p' must be a number in (0, 1]", param="top_p")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise RequestError(400, "'seed' must be an integer", param="seed")
    if temperature == 0:
        seed = None  # greedy ignores it; dropping it lets greedy requests share a batch
    sampling = SamplingConfig(temperature=float(temperature), top_p=float(top_p), max_new_tokens=max_tokens, seed=seed)
    return messages, sampling


def completion_body(gen: Generation, *, model_name: str, logprobs: bool = False) -> dict[str, Any]:
    """A ``chat.completion`` object for one successful generation.

    With ``logprobs``, each response token comes as ``{"token": "token_id:<id>", "logprob": ...}``
    (the stop token included): the form vLLM uses with ``return_tokens_as_token_ids``, so a
    client gets the exact token ids as well as their log-probabilities.
    """
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": gen.text},
                "logprobs": _token_logprobs(gen) if logprobs else None,
                "finish_reason": gen.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        },
    }


def _token_logprobs(gen: Generation) -> dict[str, Any] | None:
    if gen.token_ids is None or gen.token_logprobs is None:
        return None
    return {
        "content": [
            {"token": f"token_id:{token}", "logprob": logprob, "bytes": None, "top_logprobs": []}
            for token, logprob in zip(gen.token_ids, gen.token_logprobs)
        ]
    }


# ---- the app -----------------------------------------------------------------------------


def create_app(
    backend: Backend,
    *,
    model_name: str,
    max_new_tokens_limit: int = 1024,
    max_body_bytes: int = 4_000_000,
    batch_wait_s: float = 0.01,
    max_batch_size: int | None = None,
) -> Any:
    """A Flask app serving ``backend`` as ``model_name``; starts its generation thread.

    ``max_batch_size`` defaults to the backend's own (``HFBackend.max_batch_size``) or 16.
    The :class:`MicroBatcher` is ``app.extensions["envrl_batcher"]`` (see :func:`get_batcher`).
    """
    from flask import Flask, Response, request
    from werkzeug.exceptions import HTTPException

    if max_batch_size is None:
        max_batch_size = int(getattr(backend, "max_batch_size", 16) or 16)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    batcher = MicroBatcher(backend, max_batch_size=max_batch_size, batch_wait_s=batch_wait_s)
    app.extensions["envrl_batcher"] = batcher
    created = int(time.time())

    def respond(payload: dict[str, Any], status: int = 200) -> Response:
        return Response(json.dumps(payload), status=status, mimetype="application/json")

    def model_card() -> dict[str, Any]:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "envrl"}

    @app.errorhandler(RequestError)
    def _request_error(exc: RequestError) -> Response:
        return respond(exc.body(), exc.status)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        messages = {404: "no such route", 405: "method not allowed", 413: f"request body above {max_body_bytes} bytes"}
        message = messages.get(status, exc.name)
        kind = "invalid_request_error" if status < 500 else "server_error"
        return respond(RequestError(status, message, type=kind).body(), status)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unexpected error")
        return respond(RequestError(500, "internal server error", type="server_error").body(), 500)

    @app.get("/health")
    def health() -> Response:
        if not batcher.alive:
            return respond({"status": "generation thread stopped"}, 503)
        return respond({"status": "ok", "model": model_name})

    @app.get("/v1/models")
    def models() -> Response:
        return respond({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/<path:name>")
    def model(name: str) -> Response:
        if name != model_name:
            raise RequestError(404, f"model '{_short(name)}' not found", param="model", code="model_not_found")
        return respond(model_card())

    @app.post("/v1/chat/completions")
    def chat_completions() -> Response:
        raw = request.get_data(cache=False)  # raises 413 above MAX_CONTENT_LENGTH
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            raise RequestError(400, f"request body is not valid JSON{where}") from None
        messages, sampling = parse_chat_request(body, model_name=model_name, max_new_tokens_limit=max_new_tokens_limit)
        gen = batcher.submit(messages, sampling)
        if gen.error is not None:
            raise RequestError(500, f"generation failed: {gen.error}", type="server_error")
        return respond(completion_body(gen, model_name=model_name, logprobs=body.get("logprobs") is True))

    return app


def get_batcher(app: Any) -> MicroBatcher:
    """The app's :class:`MicroBatcher` (its ``batches``/``requests`` counters, ``close()``)."""
    return app.extensions["envrl_batcher"]


# ---- serving -----------------------------------------------------------------------------


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def serve(
    checkpoint: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    max_batch_size: int = 16,
    trust_remote_code: bool = False,
    max_new_tokens_limit: int = 1024,
    max_body_bytes: int = 4_000_000,
    batch_wait_s: float = 0.01,
) -> int:
    """Load ``checkpoint`` with :class:`HFBackend` and serve it until SIGINT or SIGTERM.

    The port is bound before the (slow) model load, so a busy port fails at once. Prints one
    line with the base URL when ready (``port=0`` picks a free port). Returns 0 after a
    signal, 1 when torch/transformers/flask are missing, the port cannot be bound or the model
    cannot be loaded (reason on stderr).
    ``model_name`` (what clients pass as ``model``) defaults to ``checkpoint`` as given.
    """
    try:  # fail before binding the port, with the fix in the message
        import flask  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        from werkzeug.serving import make_server
    except ImportError as exc:
        print(
            f"envrl: serving a model needs torch, transformers and flask: pip install 'envrl[train,llm]' ({exc})",
            file=sys.stderr,
        )
        return 1

    from envrl.agents.hf import HFBackend

    name = model_name or checkpoint
    holder: dict[str, Any] = {}

    def dispatch(environ: Any, start_response: Any) -> Any:  # the app exists only after loading
        return holder["app"](environ, start_response)

    try:
        server = make_server(host, port, dispatch, threaded=True)
    except (OSError, SystemExit) as exc:  # werkzeug prints the reason and exits 1 on a busy port
        reason = exc.strerror if isinstance(exc, OSError) else "see above"
        print(f"envrl: cannot listen on {host}:{port}: {reason or exc}", file=sys.stderr)
        return 1
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread: the caller handles signals
        pass
    backend = None
    try:
        try:
            backend = HFBackend(
                checkpoint,
                device=device,
                dtype=dtype,
                max_batch_size=max_batch_size,
                trust_remote_code=trust_remote_code,
            )
        except Exception as exc:  # missing files, bad config, corrupt weights, CUDA unavailable...
            print(f"envrl: cannot load {checkpoint}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        app = create_app(
            backend,
            model_name=name,
            max_new_tokens_limit=max_new_tokens_limit,
            max_body_bytes=max_body_bytes,
            batch_wait_s=batch_wait_s,
        )
        holder["app"] = app
        shown_host = f"[{host}]" if ":" in host else host
        print(
            f"envrl: serving {name} at http://{shown_host}:{server.server_port}/v1 "
            f"({backend.device}, {backend.dtype}; Ctrl-C to stop)",
            flush=True,
        )
        try:
            server.serve_forever()
        finally:
            get_batcher(app).close()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if backend is not None:
            backend.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


__all__ = [
    "MicroBatcher",
    "RequestError",
    "completion_body",
    "create_app",
    "get_batcher",
    "parse_chat_request",
    "serve",
]
