"""A transformers model in this process, generating for many envs at once.

Parallel envs each need one response per turn, so :meth:`HFBackend.generate` takes all their
prompts and runs them in left-padded batches. Two properties matter for experiments and are
tested:

* **batch invariance** -- a prompt's greedy text does not depend on what else is in its
  batch. Left padding with an explicit attention mask and position ids that count only real
  tokens (transformers derives them from the mask) make padding invisible to the model; what
  remains are float rounding differences between matmul shapes (~1e-7 in fp32), far below
  the gap between the top two logits of almost any decision. In bf16/fp16 the rounding is
  ~1e-2, so a rare near-tie can still flip; use float32 where exact invariance matters.
* **a recorded, complete sampling setup** -- only :class:`SamplingConfig` decides how tokens
  are chosen. A checkpoint's ``generation_config.json`` may carry its own defaults (top_k,
  repetition_penalty, ...); they are ignored so that the run record says everything. Only its
  end-of-sequence ids are kept.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from envrl.agents.generation import Generation, Message, SamplingConfig

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}
#: longest error text a Generation carries (an exception message can embed whole tensors)
_MAX_ERROR_CHARS = 500
_HEX64 = re.compile(r"[0-9a-f]{64}")


class HFBackend:
    """A causal LM loaded with ``AutoModelForCausalLM`` plus its tokenizer.

    ``model`` is a local checkpoint folder or a hub name (resolved the way transformers does,
    so ``HF_HUB_OFFLINE=1`` keeps it offline). ``device="auto"`` picks CUDA when available.
    ``dtype="auto"`` keeps the checkpoint's dtype on GPU and uses float32 on CPU, where
    half-precision matmuls are slow or unsupported.
    """

    def __init__(
        self,
        model: str,
        *,
        device: str = "auto",
        dtype: str = "auto",
        max_batch_size: int = 16,
        trust_remote_code: bool = False,
        revision: str | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = str(model)
        self.max_batch_size = max_batch_size
        self.revision_requested = revision
        self.device = _resolve_device(device)
        torch_dtype = _resolve_dtype(dtype, self.device)

        tokenizer = AutoTokenizer.from_pretrained(self.model, revision=revision, trust_remote_code=trust_remote_code)
        loaded = AutoModelForCausalLM.from_pretrained(
            self.model, revision=revision, trust_remote_code=trust_remote_code, dtype=torch_dtype
        )
        # transformers wraps ``to`` with functools.wraps, whose stub drops the method binding
        loaded.to(self.device)  # type: ignore[arg-type]
        loaded.eval()
        self._adopt(loaded, tokenizer)

    @classmethod
    def from_loaded(cls, name: str, model: Any, tokenizer: Any, *, max_batch_size: int = 16) -> HFBackend:
        """A back end over a model already in memory: a trainer's policy generates through the
        same code (prompts, batching, token log-probs) that evaluates its checkpoints. The model
        stays where it is, in the mode it is in."""
        backend = cls.__new__(cls)
        backend.model = str(name)
        backend.max_batch_size = max_batch_size
        backend.revision_requested = None
        backend.device = str(next(model.parameters()).device)
        backend._adopt(model, tokenizer)
        return backend

    def _adopt(self, model: Any, tokenizer: Any) -> None:
        """Take ``model`` and ``tokenizer`` as this back end's: a pad token, the stop ids, and a
        generation config that keeps only the checkpoint's end-of-sequence ids."""
        from transformers import GenerationConfig

        self.tokenizer = tokenizer
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._model = model
        self.dtype = str(model.dtype).removeprefix("torch.")
        original = model.generation_config
        self.stop_ids = _stop_ids(original.eos_token_id, self.tokenizer.eos_token_id)
        if not self.stop_ids:
            raise ValueError(f"{self.model}: neither the tokenizer nor generation_config names an EOS token")
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_ids[0]
        model.generation_config = GenerationConfig(
            bos_token_id=original.bos_token_id, eos_token_id=list(self.stop_ids), pad_token_id=self.pad_id
        )
        self.context_length = _context_length(model.config, self.tokenizer)
        self._weights_sha256: str | None = None
        self._weights_hashed = False

    # -- prompts -----------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, messages: Sequence[Message]) -> str:
        """The exact prompt text the model sees for ``messages`` (logged, and reused for training).

        With a chat template: the template with the assistant turn opened. Without one: the
        contents joined by blank lines plus a final newline, so base models still get a
        readable transcript.
        """
        if self.has_chat_template:
            rendered = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True, tokenize=False
            )
            return _as_text(rendered, "apply_chat_template(tokenize=False)")
        return "\n\n".join(m["content"] for m in messages) + "\n"

    def encode(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of :meth:`render`'s text, untruncated.

        A chat template already writes any BOS it wants, so special tokens are added only for
        the plain-text fallback.
        """
        text = self.render(messages)
        # verbose=False: over-long prompts are expected here; _truncate handles them (and logs)
        encoded = self.tokenizer(text, add_special_tokens=not self.has_chat_template, verbose=False)
        return list(encoded["input_ids"])

    # -- generation --------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Sequence[Message]], sampling: SamplingConfig, seeds: Sequence[int | None] | None = None
    ) -> list[Generation]:
        """One :class:`Generation` per prompt, in input order; failures come back as ``error``.

        Prompts are sorted by length before batching (less padding); the output does not
        depend on the batching for greedy decoding. With ``sampling.seed`` the whole call is
        repeatable, and the global torch RNG is left as it was.
        """
        import torch

        results: list[Generation | None] = [None] * len(prompts)
        max_new = sampling.max_new_tokens
        if self.context_length is not None:
            max_new = min(max_new, self.context_length - 1)
        encoded: list[tuple[int, list[int]]] = []
        for i, messages in enumerate(prompts):
            try:
                ids = self.encode(messages)
            except Exception as exc:  # a template that rejects these messages fails this prompt only
                results[i] = _failed(exc, 0, 0.0)
                continue
            encoded.append((i, self._truncate(ids, max_new)))

        encoded.sort(key=lambda item: len(item[1]), reverse=True)
        rng: AbstractContextManager[object] = nullcontext()
        if sampling.seed is not None:
            devices = [self.device] if self.device.startswith("cuda") else []
            rng = torch.random.fork_rng(devices=devices)
        with rng:
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed % (1 << 64))  # any int; torch takes 64 bits
            for start in range(0, len(encoded), self.max_batch_size):
                chunk = encoded[start : start + self.max_batch_size]
                for (i, _), gen in zip(chunk, self._generate_batch([ids for _, ids in chunk], sampling, max_new)):
                    results[i] = gen
        return [r if r is not None else _failed(RuntimeError("no result"), 0, 0.0) for r in results]

    def encode_response(self, text: str) -> list[int]:
        """A response's token ids as the model would write them: the text's tokens, then the
        first stop id (the end of the assistant's turn), which a policy must learn to emit."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.stop_ids[0]]

    def choose(
        self,
        prompts: Sequence[Sequence[Message]],
        candidates: Sequence[Sequence[str]],
        sampling: SamplingConfig,
        seeds: Sequence[int | None] | None = None,
        score: str = "sum",
    ) -> list[Generation]:
        """``choose`` mode (:mod:`envrl.agents.choose`): for each prompt, score its candidate
        responses (``score``: summed or mean token log-probs) and sample one from the softmax
        over their scores (greedy: the best).

        ``seeds`` (one per prompt) seed each draw; without them ``sampling.seed`` plus the
        prompt's position does. A prompt without candidates, or whose scoring fails, comes back
        as a failed :class:`Generation`.
        """
        import numpy as np
        import torch

        from envrl.agents.choose import candidate_scores, choice_distribution, sample_choice, score_candidate_sets

        began = time.perf_counter()
        results: list[Generation | None] = [None] * len(prompts)
        ready: dict[int, tuple[list[int], list[list[int]]]] = {}  # prompt index -> (prompt ids, candidates' ids)
        for i, (messages, texts) in enumerate(zip(prompts, candidates)):
            try:
                if not texts:
                    raise ValueError("choose mode needs admissible actions, and this step has none")
                options = [self.encode_response(text) for text in texts]
                ready[i] = (self._truncate(self.encode(messages), max(len(o) for o in options)), options)
            except Exception as exc:
                results[i] = _failed(exc, 0, time.perf_counter() - began)
        try:  # every prompt's candidates in as few forward passes as fit (choose's token budget per pass)
            with torch.inference_mode():
                scored = score_candidate_sets(self._model, list(ready.values()), self.pad_id)
        except Exception as exc:
            for i in ready:
                results[i] = _failed(exc, 0, time.perf_counter() - began)
            ready = {}
        latency = time.perf_counter() - began
        for (i, (prompt_ids, options)), token_logprobs in zip(ready.items(), scored if ready else []):
            scores = candidate_scores(token_logprobs, options, score)
            log_probs = choice_distribution(scores, sampling.temperature).cpu()
            seed = seeds[i] if seeds is not None and seeds[i] is not None else sampling.seed
            if seeds is None and seed is not None:
                seed = seed + i
            choice = sample_choice(np.asarray(log_probs, dtype=np.float64), sampling.temperature, seed)
            chosen = options[choice]
            results[i] = Generation(
                text=candidates[i][choice],
                finish_reason="stop",
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(chosen),
                latency=latency,
                prompt_token_ids=prompt_ids,
                token_ids=chosen,
                token_logprobs=token_logprobs[choice, : len(chosen)].tolist(),
                candidate_token_ids=options,
                choice=choice,
                choice_logprob=float(log_probs[choice]),
            )
        return [r if r is not None else _failed(RuntimeError("no result"), 0, latency) for r in results]

    def _truncate(self, ids: list[int], max_new: int) -> list[int]:
        """Keep the last tokens so that prompt + ``max_new`` fits the context window.

        The end of an agent's prompt (latest observation, the opened assistant turn) matters
        most, so the start is what gets dropped.
        """
        if self.context_length is None:
            return ids
        budget = max(1, self.context_length - max_new)
        if len(ids) > budget:
            log.warning("%s: prompt of %d tokens left-truncated to %d", self.model, len(ids), budget)
            return ids[-budget:]
        return ids

    def _generate_batch(self, batch: list[list[int]], sampling: SamplingConfig, max_new: int) -> list[Generation]:
        """One ``model.generate`` call; on out-of-memory, retry in halves; any other error fails the batch."""
        import torch

        start = time.perf_counter()
        try:
            return self._run(batch, sampling, max_new)
        except torch.OutOfMemoryError as exc:
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            if len(batch) == 1:
                return [_failed(exc, len(batch[0]), time.perf_counter() - start)]
            half = len(batch) // 2
            log.warning("%s: out of memory on a batch of %d, retrying in halves", self.model, len(batch))
            out = self._generate_batch(batch[:half], sampling, max_new)
            out += self._generate_batch(batch[half:], sampling, max_new)
            for gen in out:
                gen.attempts += 1
            return out
        except Exception as exc:
            latency = time.perf_counter() - start
            return [_failed(exc, len(ids), latency) for ids in batch]

    def _run(self, batch: list[list[int]], sampling: SamplingConfig, max_new: int) -> list[Generation]:
        import torch
        from transformers import GenerationConfig

        start = time.perf_counter()
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            if ids:
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, width - len(ids) :] = 1
        sample = sampling.temperature > 0
        config = GenerationConfig(
            max_new_tokens=max_new,
            do_sample=sample,
            num_beams=1,
            eos_token_id=list(self.stop_ids),
            pad_token_id=self.pad_id,
            **({"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0} if sample else {}),
        )
        with torch.inference_mode():
            out = self._model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                output_logits=True,
                return_dict_in_generate=True,
            )
            new = out.sequences[:, width:]
            logprobs = _sampled_logprobs(out.logits, new, sampling.temperature if sample else 1.0).tolist()
        new_tokens = new.tolist()
        latency = time.perf_counter() - start
        stops = set(self.stop_ids)
        results = []
        for ids, tokens, token_logprobs in zip(batch, new_tokens, logprobs):
            end = next((k for k, tok in enumerate(tokens) if tok in stops), None)
            if end is None:
                count, reason = len(tokens), "length"
            else:  # the stop token is counted but is not part of the text
                count, reason = end + 1, "stop"
            text = _as_text(self.tokenizer.decode(tokens[:end], skip_special_tokens=True), "decode")
            results.append(
                Generation(
                    text=text,
                    finish_reason=reason,
                    prompt_tokens=len(ids),
                    completion_tokens=count,
                    latency=latency,
                    prompt_token_ids=list(ids),
                    token_ids=tokens[:count],
                    token_logprobs=token_logprobs[:count],
                )
            )
        return results

    # -- bookkeeping -------------------------------------------------------------------------

    def protocol(self) -> dict[str, Any]:
        """Model identity and settings; ``weights_sha256`` is computed on the first call and cached."""
        return {
            "backend": "hf",
            "model": self.model,
            "revision": self.revision(),
            "weights_sha256": self.weights_sha256(),
            "dtype": self.dtype,
            "device": self.device,
            "chat_template": self.has_chat_template,
            "context_length": self.context_length,
            "max_batch_size": self.max_batch_size,
        }

    def revision(self) -> str | None:
        """The hub commit the weights came from; ``None`` for a local folder."""
        folder = self._snapshot_dir()
        if folder is None or Path(self.model).is_dir():
            return None
        return folder.name if re.fullmatch(r"[0-9a-f]{40}", folder.name) else self.revision_requested

    def weights_sha256(self) -> str | None:
        """A fingerprint of config.json and the weight files, or ``None`` if they cannot be found.

        Each file contributes its name and sha256. Hub-cache blobs are named by the sha256 of
        their content, so those cost nothing; other files are read once (~1-2 GB/s, so a
        15 GB checkpoint takes ~10 s) and the result is cached on this object.
        """
        if not self._weights_hashed:
            self._weights_hashed = True
            folder = self._snapshot_dir()
            self._weights_sha256 = _fingerprint(folder) if folder is not None else None
        return self._weights_sha256

    def _snapshot_dir(self) -> Path | None:
        return snapshot_dir(self.model, self.revision_requested)

    def close(self) -> None:
        """Drop the model so its memory can be reclaimed."""
        self._model = None
        try:
            import torch

            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
        except Exception:
            pass


def _sampled_logprobs(logits: Sequence[Any], tokens: Any, temperature: float) -> Any:
    """``[batch, new]`` log-probabilities of the generated ``tokens`` under ``logits / temperature``.

    ``logits`` are ``generate``'s raw per-step scores (before temperature and top-p), one
    ``[batch, vocab]`` tensor per new token; positions after a row stopped hold padding and
    are cut off by the caller.
    """
    import torch

    stacked = torch.stack(list(logits), dim=1).float() / temperature
    return torch.log_softmax(stacked, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1).cpu()


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype == "auto":
        return "auto" if device.startswith("cuda") else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose auto or one of {sorted(_DTYPES)}")
    return getattr(torch, _DTYPES[dtype])


def _stop_ids(*sources: Any) -> tuple[int, ...]:
    """Every end-of-sequence id named by generation_config or the tokenizer, in first-seen order."""
    ids: list[int] = []
    for source in sources:
        for tok in source if isinstance(source, (list, tuple)) else [source]:
            if tok is not None and int(tok) not in ids:
                ids.append(int(tok))
    return tuple(ids)


def _context_length(config: Any, tokenizer: Any) -> int | None:
    """The model's context window: config first (``max_position_embeddings`` and kin), then tokenizer."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    # tokenizers without a limit report a huge sentinel (1e30)
    return value if isinstance(value, int) and 0 < value < 10_000_000 else None


def snapshot_dir(model: str, revision: str | None = None) -> Path | None:
    """The folder holding ``model``'s files: the model itself when it is a local folder, else
    its snapshot in the hub cache; ``None`` when it is not on this machine (no download)."""
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json", revision=revision)
    except Exception:
        return None
    return Path(found).parent if isinstance(found, str) else None


def weights_fingerprint(model: str, revision: str | None = None) -> str | None:
    """:meth:`HFBackend.weights_sha256` without loading the model (runs record it up front)."""
    folder = snapshot_dir(model, revision)
    return _fingerprint(folder) if folder is not None else None


def _fingerprint(folder: Path) -> str | None:
    weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    config = folder / "config.json"
    if not weights or not config.is_file():
        return None
    digest = hashlib.sha256()
    for file in [config, *weights]:
        digest.update(f"{file.name}\0{_file_sha256(file)}\n".encode())
    return digest.hexdigest()


def _file_sha256(file: Path) -> str:
    blob = file.resolve()
    if file.is_symlink() and blob.parent.name == "blobs" and _HEX64.fullmatch(blob.name):
        return blob.name  # hub cache: an LFS blob's name is the sha256 of its content
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        while chunk := fh.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _as_text(value: object, call: str) -> str:
    """``value`` from a tokenizer call that returns text for one unbatched sequence.

    The stubs type these calls for batches too (``str | list[str] | ...``); a tokenizer from
    remote code could still break the contract, and that is better named here than later.
    """
    if not isinstance(value, str):
        raise TypeError(f"tokenizer.{call} returned {type(value).__name__}, expected str")
    return value


def _failed(exc: BaseException, prompt_tokens: int, latency: float) -> Generation:
    message = f"{type(exc).__name__}: {exc}"
    if len(message) > _MAX_ERROR_CHARS:
        message = message[:_MAX_ERROR_CHARS] + "..."
    return Generation(
        text="", finish_reason="error", prompt_tokens=prompt_tokens, completion_tokens=0, latency=latency, error=message
    )
