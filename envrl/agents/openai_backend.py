"""A :class:`~envrl.agents.generation.Backend` for any OpenAI-compatible chat server.

The same class talks to the official API and to local servers (vLLM, SGLang, llama.cpp,
Ollama), so an evaluation can swap models by changing one spec string
(:func:`parse_openai_spec`). Evaluations run for hours against servers that misbehave, so
this module is built around failure rather than the happy path:

* The ``openai`` client's own retries are off (``max_retries=0``); the loop here retries,
  so every attempt is counted in :attr:`Generation.attempts` and in :meth:`OpenAIBackend.stats`,
  and the final error says what went wrong on the last attempt.
* Only failures that another attempt can fix are retried: timeouts, connection errors,
  408, 429 (honouring ``Retry-After``), 5xx and unusable 2xx bodies. Other 4xx mean the
  request itself is wrong (bad key, unknown model, context too long) and fail at once.
* The body is read by this module, not parsed by the client's pydantic models, so a
  server returning HTML, JSON without ``choices`` or a ``null`` content is a retryable
  "bad response" instead of an exception, and a runaway server is cut off:
  a body over :data:`MAX_BODY_BYTES` fails the request, and the text kept from a response
  is at most :data:`MAX_TEXT_CHARS` characters (``finish_reason="length"`` when cut, like a
  model hitting its token limit) so one reply cannot bloat memory or run records.
* The API key comes only from an environment variable; it is never part of the spec, the
  protocol, ``repr`` or an error message.
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import os
import random
import re
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from envrl.agents.generation import Generation, Message, SamplingConfig

#: where a spec without ``@<url>`` goes; passed explicitly so ``OPENAI_BASE_URL`` in the
#: environment cannot silently send a run somewhere its record does not say
OFFICIAL_BASE_URL = "https://api.openai.com/v1"
#: at most this many characters of a response's text are kept (64 Ki characters)
MAX_TEXT_CHARS = 64 * 1024
#: a response body larger than this (32 MiB) fails the request without a retry
MAX_BODY_BYTES = 32 * 1024 * 1024
#: error strings are one line of at most this many characters
MAX_ERROR_CHARS = 300
#: the key sent to a local server when the key variable is unset (vLLM's convention)
LOCAL_API_KEY = "EMPTY"

_SPEC_WITH_URL = re.compile(r"^(?P<model>.*)@(?P<url>https?://.*)$", re.IGNORECASE | re.DOTALL)
_ANY_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_BARE_HOST = re.compile(r"^(localhost|[\w.-]+:\d+|\d{1,3}(\.\d{1,3}){3})([:/]|$)", re.IGNORECASE)
_SPEC_HELP = "expected '<model>' or '<model>@<http(s)://base_url>', e.g. 'qwen2.5-1.5b@http://localhost:8000/v1'"


def parse_openai_spec(spec: str) -> tuple[str, str | None]:
    """Split ``"<model>@<base_url>"`` into ``(model, base_url)``; ``base_url`` is ``None``
    (the official API) when the spec is a bare model name.

    Model names may hold ``:``, ``/`` and even ``@`` (``claude-3@20240229``), so the split is
    on the last ``@`` that starts an ``http://`` or ``https://`` URL. A tail that looks like a
    URL without a usable scheme (``m@localhost:8000``, ``m@ftp://h``) is an error rather than
    part of the model name, since sending it to the official API would be a silent mistake.
    """
    if not isinstance(spec, str):
        raise ValueError(f"OpenAI agent spec must be a string, got {type(spec).__name__}; {_SPEC_HELP}")
    text = spec.strip()
    if not text:
        raise ValueError(f"empty OpenAI agent spec; {_SPEC_HELP}")
    match = _SPEC_WITH_URL.match(text)
    if match:
        model, url = match["model"].strip(), match["url"].strip()
        if not model:
            raise ValueError(f"OpenAI agent spec {_redact_spec(text)!r} has no model name; {_SPEC_HELP}")
        _check_model(model)
        _check_base_url(url)
        return model, url
    if "@" in text:
        tail = text.rpartition("@")[2]
        if _ANY_SCHEME.match(tail):
            raise ValueError(
                f"OpenAI agent spec {_redact_spec(text)!r}: only http:// and https:// base URLs are supported"
            )
        if _BARE_HOST.match(tail):
            raise ValueError(
                f"OpenAI agent spec {_redact_spec(text)!r}: the base URL needs a scheme, e.g. '...@http://{tail}'"
            )
    _check_model(text)
    return text, None


class OpenAIBackend:
    """Chat completions from an OpenAI-compatible server, many prompts at a time.

    ``generate`` sends its prompts concurrently (at most ``max_concurrency`` requests in
    flight, one thread pool per backend reused across calls) and returns one
    :class:`Generation` per prompt, in order. A request is tried ``max_retries + 1`` times
    at most, with exponential backoff (``backoff_base * 2**k``, capped at ``backoff_max``,
    jittered into its upper half so retries from many threads do not align). Each attempt is
    bounded by ``timeout`` per network operation plus ``timeout`` for reading the body, so a
    request takes roughly ``(max_retries + 1) * timeout`` plus backoffs at worst.

    ``generate`` may be called from one thread at a time; :meth:`stats` may be read from any.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        max_retries: int = 4,
        timeout: float = 60.0,
        backoff_base: float = 0.5,
        backoff_max: float = 20.0,
        logprobs: bool = False,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ValueError("OpenAIBackend needs a non-empty model name")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if backoff_base < 0 or backoff_max < 0:
            raise ValueError(f"backoffs must be >= 0, got base={backoff_base} max={backoff_max}")
        url = OFFICIAL_BASE_URL if base_url is None else base_url.strip()
        _check_base_url(url)
        api_key = (os.environ.get(api_key_env) or "").strip()
        if not api_key:
            if not _is_local(url):
                raise ValueError(
                    f"environment variable {api_key_env} is not set; it must hold the API key for "
                    f"{_public_url(url)} (only servers on localhost may go without a key)"
                )
            api_key = LOCAL_API_KEY
        try:
            import openai
        except ImportError as exc:  # an optional dependency: only LLM agents need it
            raise ImportError("OpenAIBackend needs the 'openai' package: pip install openai") from exc

        self.model = model.strip()
        self.base_url = _public_url(url)
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout = float(timeout)
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self.logprobs = bool(logprobs)
        self._openai = openai
        self._secret = api_key  # kept only to scrub it from error text
        self._client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=self.timeout)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="envrl-openai")
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._rng = random.Random()
        self._stats = dict.fromkeys(
            ("requests", "attempts", "retries", "failed_requests", "prompt_tokens", "completion_tokens"), 0
        )

    def __repr__(self) -> str:
        return f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r})"

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- Backend protocol ------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Sequence[Message]], sampling: SamplingConfig, seeds: Sequence[int | None] | None = None
    ) -> list[Generation]:
        """One :class:`Generation` per prompt, in input order; a request that fails for good
        comes back with ``error`` set instead of raising. ``seeds`` give each request its own
        seed (so identical prompts in one call are sampled independently)."""
        if self._closed.is_set():
            raise RuntimeError("OpenAIBackend.generate() called after close()")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        batch = [[dict(message) for message in prompt] for prompt in prompts]
        settings = [sampling] * len(batch) if seeds is None else [replace(sampling, seed=seed) for seed in seeds]
        futures = [self._pool.submit(self._complete, messages, setting) for messages, setting in zip(batch, settings)]
        return [future.result() for future in futures]

    def protocol(self) -> dict[str, Any]:
        """The server and retry settings a run records; never the key, userinfo or query."""
        return {
            "backend": "openai",
            "model": self.model,
            "base_url": self.base_url,
            "max_retries": self.max_retries,
            "timeout": self.timeout,
        }

    def close(self) -> None:
        """Stop pending backoffs, wait for requests in flight, close the pool and the client."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def stats(self) -> dict[str, int]:
        """Totals since creation: ``requests`` (one per prompt), ``attempts`` (HTTP requests
        sent), ``retries`` (attempts after the first), ``failed_requests`` (ended in error),
        and the ``prompt_tokens``/``completion_tokens`` the server reported."""
        with self._lock:
            return dict(self._stats)

    # -- one request -----------------------------------------------------------------------

    def _complete(self, messages: list[Message], sampling: SamplingConfig) -> Generation:
        """Try one prompt until it succeeds, fails for good, or the retries run out."""
        params: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "n": 1,
        }
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        if self.logprobs:
            params["logprobs"] = True
        attempts = 0
        while True:
            attempts += 1
            started = time.monotonic()
            try:
                outcome = self._attempt(params)
            except Exception as exc:  # a bug must not take the whole batch down
                outcome = AttemptFailure("unexpected error", f"{type(exc).__name__}: {exc}", retryable=False)
            latency = time.monotonic() - started
            if isinstance(outcome, Generation):
                outcome.latency, outcome.attempts = latency, attempts
                self._record(attempts, outcome)
                return outcome
            if not outcome.retryable or attempts > self.max_retries:
                return self._give_up(outcome, attempts)
            if self._closed.wait(self._backoff(attempts, outcome.retry_after)):
                return self._give_up(outcome, attempts, note="backend closed")

    def _attempt(self, params: dict[str, Any]) -> Generation | AttemptFailure:
        """Send one HTTP request and turn whatever happens into a result or a failure."""
        openai = self._openai
        try:
            with self._client.chat.completions.with_streaming_response.create(**params) as response:
                body = self._read_body(response)
        except openai.APITimeoutError:
            return AttemptFailure("timeout", f"no response within {self.timeout:g}s", retryable=True)
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            return AttemptFailure("connection error", f"{type(cause).__name__}: {cause}", retryable=True)
        except openai.APIStatusError as exc:
            status = exc.status_code
            retryable = status in (408, 429) or status >= 500
            retry_after = _retry_after(exc.response.headers) if retryable else None
            return AttemptFailure(
                f"HTTP {status}", _error_detail(exc.body), retryable=retryable, retry_after=retry_after
            )
        if isinstance(body, AttemptFailure):
            return body
        return parse_completion(body)

    def _read_body(self, response: Any) -> bytes | AttemptFailure:
        """Read the body with a size cap and a deadline; the client only bounds each read."""
        deadline = time.monotonic() + self.timeout
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    return AttemptFailure(
                        "oversized response", f"body over {MAX_BODY_BYTES // 2**20} MiB", retryable=False
                    )
                if time.monotonic() > deadline:
                    return AttemptFailure("timeout", f"body still arriving after {self.timeout:g}s", retryable=True)
                chunks.append(chunk)
        except Exception as exc:  # transport errors surface here unwrapped by the client
            kind = "timeout" if "timeout" in type(exc).__name__.lower() else "connection error"
            return AttemptFailure(kind, f"{type(exc).__name__} while reading the body: {exc}", retryable=True)
        return b"".join(chunks)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before the next attempt: the server's ``Retry-After`` when it sent
        one, else jittered exponential backoff; both capped at ``backoff_max``."""
        if retry_after is not None:
            return min(retry_after, self.backoff_max)
        ceiling = min(self.backoff_max, self.backoff_base * 2.0 ** min(attempt - 1, 60))
        with self._lock:
            jitter = self._rng.random()
        return ceiling * (0.5 + 0.5 * jitter)

    def _give_up(self, failure: AttemptFailure, attempts: int, note: str = "") -> Generation:
        plural = "attempt" if attempts == 1 else "attempts"
        detail = f"{failure.detail} ({note})" if note else failure.detail
        error = _one_line(f"{failure.kind} after {attempts} {plural}: {detail}", self._secret)
        generation = Generation(text="", finish_reason="error", attempts=attempts, error=error)
        self._record(attempts, generation)
        return generation

    def _record(self, attempts: int, generation: Generation) -> None:
        with self._lock:
            self._stats["requests"] += 1
            self._stats["attempts"] += attempts
            self._stats["retries"] += attempts - 1
            self._stats["failed_requests"] += generation.error is not None
            self._stats["prompt_tokens"] += generation.prompt_tokens
            self._stats["completion_tokens"] += generation.completion_tokens


@dataclass
class AttemptFailure:
    """Why one attempt failed, and whether another attempt could help."""

    kind: str
    detail: str
    retryable: bool
    retry_after: float | None = None


def parse_completion(raw: bytes) -> Generation | AttemptFailure:
    """A chat.completion body to a :class:`Generation`; anything unusable is a retryable
    "bad response" (servers under load return truncated or empty bodies now and then)."""

    def bad(why: str) -> AttemptFailure:
        return AttemptFailure("bad response", why, retryable=True)

    try:
        body = json.loads(raw)
    except ValueError:
        return bad(f"not JSON: {raw[:120].decode('utf-8', 'replace')!r}")
    if not isinstance(body, dict):
        return bad(f"JSON {type(body).__name__}, not an object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        error = body.get("error")
        hint = f" (error: {_error_detail(error)})" if error else ""
        return bad(("no choices" if choices is None else "empty choices") + hint)
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        return bad("first choice has no text content")
    finish_reason = "length" if choice.get("finish_reason") == "length" else "stop"
    if len(content) > MAX_TEXT_CHARS:
        content, finish_reason = content[:MAX_TEXT_CHARS], "length"
    usage = body.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    token_ids, token_logprobs = _token_logprobs(choice.get("logprobs"))
    return Generation(
        text=content,
        finish_reason=finish_reason,
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        token_ids=token_ids,
        token_logprobs=token_logprobs,
    )


def _token_logprobs(logprobs: object) -> tuple[list[int] | None, list[float] | None]:
    """Token ids and log-probabilities from a choice's ``logprobs``, where the server sent them.

    The ids are known only when every token is written ``token_id:<id>`` (``envrl serve-model``,
    and vLLM with ``return_tokens_as_token_ids``); anything malformed gives None, never an error.
    """
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None, None
    values = [item.get("logprob") if isinstance(item, dict) else None for item in content]
    floats = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(floats) != len(values):
        return None, None
    tokens = [item.get("token") for item in content]
    ids = None
    if all(isinstance(t, str) and t.startswith("token_id:") and t[9:].isdigit() for t in tokens):
        ids = [int(t[9:]) for t in tokens]
    return ids, floats


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _error_detail(body: object) -> str:
    """The server's own message from an error body (``{"error": {"message": ...}}`` or text)."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            message = inner.get("message")
            if isinstance(message, str) and message:
                return message
        elif isinstance(inner, str) and inner:
            return inner
        return json.dumps(body, default=str)[:200]
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body[:400]).decode("utf-8", "replace")
    return str(body)[:400] if body not in (None, "") else "(empty body)"


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked us to wait: ``retry-after-ms``, or ``Retry-After`` as
    seconds or an HTTP date; ``None`` when absent or unreadable."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _one_line(text: str, secret: str) -> str:
    """Collapse whitespace, scrub the key and cap the length, for an error field in a record."""
    if secret and secret != LOCAL_API_KEY:
        text = text.replace(secret, "***")
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _check_model(model: str) -> None:
    if any(char.isspace() for char in model):
        raise ValueError(f"model name {model!r} contains whitespace; {_SPEC_HELP}")


def _check_base_url(url: str) -> None:
    """Reject what cannot work or would leak: other schemes, no host, credentials in the URL."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"invalid base URL {_public_url(url)!r}: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"base URL {_public_url(url)!r} must start with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"base URL {_public_url(url)!r} has no host")
    if "@" in parts.netloc:
        raise ValueError(
            f"credentials in the base URL ({_public_url(url)!r} with user@host) are not supported; "
            "put the API key in the environment variable instead"
        )
    if any(char.isspace() for char in url):
        raise ValueError(f"base URL {_public_url(url)!r} contains whitespace")


def _public_url(url: str) -> str:
    """The URL without userinfo, query or fragment: safe to log and record."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _redact_spec(spec: str) -> str:
    """A spec for an error message, with any URL's userinfo and query removed."""
    without_userinfo = re.sub(r"://[^/?#\s]*@", "://", spec)
    return re.sub(r"(://[^?#]*)[?#].*$", r"\1", without_userinfo, flags=re.DOTALL)


def _is_local(url: str) -> bool:
    """Whether the server runs on this machine, where a key is usually not needed."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = [
    "LOCAL_API_KEY",
    "MAX_BODY_BYTES",
    "MAX_TEXT_CHARS",
    "OFFICIAL_BASE_URL",
    "OpenAIBackend",
    "parse_openai_spec",
]
