"""The policy: a causal LM that acts through the same prompts, parser and back end as ``hf:`` agents.

Acting goes through :class:`~envrl.agents.hf.HFBackend` built over the model being trained
(:meth:`HFBackend.from_loaded`) and :class:`~envrl.agents.llm.LLMAgent`, so rollouts render
prompts, sample, parse and record token ids and log-probabilities with exactly the code that
later evaluates the saved checkpoint (``envrl eval --agent hf:DIR``). Learning needs one more
thing, which this module adds: the log-probabilities of given responses under the current
weights, with gradients.

A sample to score has ``prompt_ids`` and ``response_ids``; a ``choose``-mode sample also has
``candidate_ids`` and ``choice``. Its scored "tokens" are:

* generate mode (and SFT targets): every response token, ``log softmax(logits / T)[y_j]``,
  with the sampling temperature ``T`` the rollout used, so old and new log-probs compare;
* choose mode: one unit, the choice's log-probability ``log softmax(scores / T)[choice]`` over
  the candidates' summed token log-probs (:mod:`envrl.agents.choose`).

Both come back padded into ``[B, T]`` tensors with a mask, so every loss is written once.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from envrl.agents.choose import candidate_scores, choice_distribution, forward_batches, score_candidate_sets
from envrl.agents.generation import SamplingConfig
from envrl.agents.hf import HFBackend
from envrl.agents.llm import LLMAgent, LLMOptions, SharedBackend
from envrl.agents.prompts import load_template
from envrl.training.config import PolicyConfig


class ScoredSample(Protocol):
    """What :meth:`Policy.logprobs` reads from a sample (rollout steps and SFT rows both have it)."""

    prompt_ids: list[int]
    response_ids: list[int]
    candidate_ids: list[list[int]] | None
    choice: int | None


@dataclass
class Scores:
    """``[B, T]`` log-probabilities of the scored units, their mask and each unit's entropy."""

    logprobs: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor


def scored_units(sample: ScoredSample) -> int:
    """How many units a sample contributes to a token-mean: its response tokens, or 1 choice."""
    return 1 if sample.candidate_ids is not None else len(sample.response_ids)


class Policy:
    """A causal LM being trained (see the module docstring).

    ``model`` is what the optimizer updates and what a distributed wrapper (accelerate) may
    wrap: :meth:`logprobs` calls it. Acting and saving use the unwrapped model.
    """

    def __init__(self, config: PolicyConfig, env_name: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not config.model:
            raise ValueError("no model: set --model PATH (a checkpoint folder, e.g. one made by `envrl model init`)")
        path = Path(config.model).expanduser()
        if config.model.startswith(("/", "./", "../", "~")) and not path.exists():
            raise ValueError(f"no checkpoint at {config.model}")
        self.config = config
        self.env_name = env_name
        self.template = load_template(config.template)
        device = _device(config.device)
        dtype = _dtype(config.dtype, device)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model)
        model: Any = AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype)
        model.to(device)
        embeddings = model.get_input_embeddings().weight.shape[0]
        if len(self.tokenizer) > embeddings:
            raise ValueError(
                f"{config.model}: its tokenizer has {len(self.tokenizer)} tokens but the model's embedding only "
                f"{embeddings}: the checkpoint was saved with another tokenizer; use the tokenizer it was trained with"
            )
        self.reference: Any = None
        # set inside reference_scoring(): the model that scoring without an explicit one uses
        self._scoring_model: Any = None
        if config.lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules="all-linear")
            model = get_peft_model(model, lora)
        self.model: Any = model
        self.backend = HFBackend.from_loaded(config.model, model, self.tokenizer)
        self.end_id = self.backend.stop_ids[0]
        self.sampling = SamplingConfig(
            temperature=config.temperature, top_p=config.top_p, max_new_tokens=config.max_new_tokens
        )

    @property
    def unwrapped(self) -> Any:
        """The model without a distributed wrapper (DDP keeps it as ``.module``)."""
        return getattr(self.model, "module", self.model)

    @property
    def device(self) -> torch.device:
        return next(self.unwrapped.parameters()).device

    # ---- acting ----------------------------------------------------------------------------

    def agents(self, count: int) -> list[LLMAgent]:
        """``count`` agents that act with this policy (one batched call per turn), as an ``hf:``
        agent with the same options would."""
        options = LLMOptions(
            template=self.config.template,
            history=self.config.history,
            sampling=self.sampling,
            action_mode=self.config.action_mode,
            choose_score=self.config.choose_score,
        )
        shared = SharedBackend(lambda: self.backend, {"backend": "hf", "model": self.config.model})
        # the policy owns its model: closing an agent must not drop it
        first = LLMAgent(f"policy:{self.config.model}", self.env_name, shared, options, self.template, False)
        return [first] + [first.sibling() for _ in range(count - 1)]

    def encode_prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.backend.encode(messages)

    def encode_response(self, text: str) -> list[int]:
        return self.backend.encode_response(text)

    def encode_response_span(self, text: str, start: int, end: int) -> tuple[list[int], int, int]:
        """``text`` encoded as :meth:`encode_response` encodes it (its tokens, then the end-of-turn
        token) and the token span ``[first, last)`` that writes its characters ``text[start:end]``:
        the tokens that carry any of them (none for an empty span). The text is tokenized once,
        whole, so the tokens are the ones the policy writes; where BPE merged a character of the
        span with one beside it into one token (``>t`` in ``<action>take``), that token is in the
        span, since it cannot be split without changing them. The end-of-turn token is never in it."""
        ids = self.encode_response(text)
        bounds = token_bounds(self.tokenizer, text, ids[:-1])
        first = next((k for k, (_, stop) in enumerate(bounds) if stop > start), len(bounds))
        if end <= start:
            return ids, first, first
        last = next((k for k in range(first, len(bounds)) if bounds[k][0] >= end), len(bounds))
        return ids, first, last

    # ---- learning --------------------------------------------------------------------------

    def logprobs(self, samples: Sequence[ScoredSample], model: Any = None, temperature: float | None = None) -> Scores:
        """The scored units of ``samples`` under ``model`` (default: the trained model), with
        gradients; ``temperature`` defaults to the rollouts' (SFT passes 1)."""
        return self._scores(samples, [[] for _ in samples], model, temperature)[0]

    def logprobs_with_branches(
        self, samples: Sequence[ScoredSample], branches: Sequence[Sequence[ScoredSample]]
    ) -> tuple[Scores, list[list[torch.Tensor]]]:
        """:meth:`logprobs` of ``samples`` (trained model, rollout temperature) and, per sample,
        the response tokens' log-probs (temperature 1, with gradients) of its ``branches``:
        generated-mode rows scored beside it (ENVRL's SP and ID rows of the step's transition).

        A branch whose prompt begins with its sample's whole prompt is scored in that sample's
        packed row (:func:`~envrl.agents.choose.score_candidate_sets`): one more candidate after
        the prompt, its rest of the prompt context and its response scored, so the prompt, which
        the sample needs anyway, costs nothing more (a generate-mode sample's response is then a
        candidate too, at the rollout temperature, with its entropies). Every other branch goes
        through :meth:`shared_prefix_logprobs`, the branches of one sample as one group. Either
        way each token is scored exactly as it would be alone, up to float rounding.
        """
        if len(branches) != len(samples):
            raise ValueError(f"{len(samples)} samples need as many lists of branches, got {len(branches)}")
        return self._scores(samples, branches, None, None)

    def _scores(
        self,
        samples: Sequence[ScoredSample],
        branches: Sequence[Sequence[ScoredSample]],
        model: Any,
        temperature: float | None,
    ) -> tuple[Scores, list[list[torch.Tensor]]]:
        model = self._active_model() if model is None else model
        temperature = self._temperature() if temperature is None else temperature
        rows: list[tuple[torch.Tensor, torch.Tensor]] = [None] * len(samples)  # type: ignore[list-item]
        out: list[list[torch.Tensor]] = [[None] * len(row) for row in branches]  # type: ignore[list-item]
        # per sample, the branches its packed row takes
        joined = [[j for j, b in enumerate(row) if extends(b, s)] for s, row in zip(samples, branches)]
        # a generated-mode sample is packed only when branches join it; alone it is a plain row
        plain = [i for i, s in enumerate(samples) if s.candidate_ids is None and not joined[i]]
        if plain:
            for i, row in zip(plain, self._response_logprobs(model, [samples[i] for i in plain], temperature)):
                rows[i] = row
        packed = sorted(set(range(len(samples))) - set(plain))
        if packed:
            joined_rows = [[branches[i][j] for j in joined[i]] for i in packed]
            results = self._packed_logprobs(model, [samples[i] for i in packed], temperature, joined_rows)
            for i, (row, extra) in zip(packed, results):
                rows[i] = row
                for j, values in zip(joined[i], extra):
                    out[i][j] = values
        rest = [[j for j in range(len(row)) if j not in joined[i]] for i, row in enumerate(branches)]
        owners = [i for i, js in enumerate(rest) if js]
        if owners:
            groups = self.shared_prefix_logprobs([[branches[i][j] for j in rest[i]] for i in owners])
            for i, group in zip(owners, groups):
                for j, values in zip(rest[i], group):
                    out[i][j] = values
        return _pad(rows, self.device), out

    def shared_prefix_logprobs(self, groups: Sequence[Sequence[ScoredSample]]) -> list[list[torch.Tensor]]:
        """Per group, per sample, the response tokens' log-probs (temperature 1, with gradients)
        of generated-mode samples that come in groups whose rows begin alike (ENVRL's SP and ID
        rows of one transition: the same system message and state ``s_t``).

        Each group is one packed row (:func:`~envrl.agents.choose.score_candidate_sets`): the
        tokens its samples share from the start (short of the shortest prompt's last token)
        computed once, then each sample's remaining prompt and response as a candidate that sees
        the shared part and itself only, at the positions it has alone, its response scored.
        Every token is thus scored exactly as :meth:`logprobs` scores it, and the shared tokens
        cost one pass instead of one per sample. A group whose samples share no token is scored
        sample by sample the same way.
        """
        items: list[tuple[list[int], list[list[int]]]] = []
        starts: list[list[int]] = []  # per item, per candidate: its response's first token
        places: list[list[tuple[int, int]]] = []  # per group, per sample: (item, candidate)
        for group in groups:
            rows = [list(s.prompt_ids) + list(s.response_ids) for s in group]
            shared = shared_start(group)
            parts = [list(range(len(rows)))] if shared > 0 else [[j] for j in range(len(rows))]
            place: list[tuple[int, int]] = [(0, 0)] * len(rows)
            for part in parts:
                cut = shared if shared > 0 else len(group[part[0]].prompt_ids)
                for branch, j in enumerate(part):
                    place[j] = (len(items), branch)
                items.append((rows[part[0]][:cut], [rows[j][cut:] for j in part]))
                starts.append([len(rows[j]) - cut - len(group[j].response_ids) for j in part])
            places.append(place)
        grids = score_candidate_sets(self._active_model(), items, self.backend.pad_id, starts) if items else []
        return [
            [grids[item][branch, : len(sample.response_ids)] for (item, branch), sample in zip(place, group)]
            for place, group in zip(places, groups)
        ]

    def reference_logprobs(self, samples: Sequence[ScoredSample]) -> torch.Tensor:
        """Log-probs under the frozen reference (the starting weights), without gradients: with
        LoRA the base model with its adapters off (no extra memory), else the copy
        :meth:`keep_reference` made."""
        with torch.no_grad(), self.reference_scoring():
            return self.logprobs(samples).logprobs

    @contextmanager
    def reference_scoring(self) -> Iterator[None]:
        """Within it, every scoring call that names no model (:meth:`logprobs`,
        :meth:`logprobs_with_branches`, :meth:`shared_prefix_logprobs`) scores with the frozen
        reference instead of the trained model, through the very same code path: the loop scores
        an update's samples once this way, with whatever rows the algorithm's loss packs them
        in, so the KL term compares the two models on identical computations."""
        if self.config.lora_rank > 0:
            with self.unwrapped.disable_adapter():
                self._scoring_model = self.unwrapped
                try:
                    yield
                finally:
                    self._scoring_model = None
            return
        if self.reference is None:
            raise RuntimeError("call keep_reference() before training starts")
        self._scoring_model = self.reference
        try:
            yield
        finally:
            self._scoring_model = None

    def keep_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference (not needed with LoRA).

        Call it after the model is placed and wrapped for training (``accelerator.prepare``): the
        copy then sits on the same device and its forward is the wrapped one, autocast included
        (accelerate patches the module's ``forward``, and a deep copy keeps the patch, bound to
        the copy). A copy made before would score a bf16-autocast policy in float32 (a KL of
        ~1e-3 per token at the start, measured on the tiny model) and, on several GPUs, sit on the
        first one while each process's policy sits on its own."""
        if self.config.lora_rank == 0 and self.reference is None:
            self.reference = copy.deepcopy(self.unwrapped).eval().requires_grad_(False)

    def dropout(self) -> float:
        """The largest dropout probability the trained model applies in train mode (its dropout
        modules and the attention dropout its config names): above 0 two forward passes of the
        same weights differ, so the PPO ratio at an update's first minibatch is 1 only in
        expectation."""
        probabilities = [float(m.p) for m in self.unwrapped.modules() if isinstance(m, torch.nn.Dropout)]
        config = getattr(self.unwrapped, "config", None)
        for key in ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop", "dropout"):
            value = getattr(config, key, None)
            if isinstance(value, int | float):
                probabilities.append(float(value))
        return max(probabilities, default=0.0)

    def _active_model(self) -> Any:
        return self.model if self._scoring_model is None else self._scoring_model

    def _response_logprobs(
        self, model: Any, samples: Sequence[ScoredSample], temperature: float
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each sample's response-token log-probs and entropies, in order: one forward per group
        of similar lengths within the device's token budget (:func:`~envrl.agents.choose.forward_batches`,
        as packed rows run), so that short rows are not padded to the longest (rows of ~150 to ~540
        tokens in one padded batch were 44% padding) and a CPU's passes stay in its caches."""
        lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
        out: list[tuple[torch.Tensor, torch.Tensor]] = [None] * len(samples)  # type: ignore[list-item]
        for batch in forward_batches(lengths, self.device):
            for i, row in zip(batch, self._padded_response_logprobs(model, [samples[i] for i in batch], temperature)):
                out[i] = row
        return out

    def _padded_response_logprobs(
        self, model: Any, samples: Sequence[ScoredSample], temperature: float
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One forward over left-padded prompt + response rows; each row's response tokens. Every
        response ends its row, so the model computes logits for the last ``keep`` positions only."""
        device = self.device
        width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
        keep = max(len(s.response_ids) for s in samples) + 1
        ids = torch.full((len(samples), width), self.backend.pad_id, dtype=torch.long, device=device)
        attention = torch.zeros((len(samples), width), dtype=torch.long, device=device)
        positions = torch.zeros((len(samples), width), dtype=torch.long, device=device)
        for row, s in enumerate(samples):
            tokens = list(s.prompt_ids) + list(s.response_ids)
            ids[row, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long, device=device)
            attention[row, width - len(tokens) :] = 1
            positions[row, width - len(tokens) :] = torch.arange(len(tokens), device=device)
        output = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=keep)
        logits = output.logits.float() / temperature
        out = []
        for row, s in enumerate(samples):
            count = len(s.response_ids)
            # column c is position width - keep + c; the response's tokens are predicted by the
            # positions just before each: the last count + 1 columns but the final one
            row_logits = logits[row, keep - count - 1 : keep - 1]
            log_probs = torch.log_softmax(row_logits, dim=-1)
            targets = ids[row, width - count :]
            token_logprobs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            out.append((token_logprobs, entropy))
        return out

    def _packed_logprobs(
        self,
        model: Any,
        samples: Sequence[ScoredSample],
        temperature: float,
        branches: Sequence[Sequence[ScoredSample]],
    ) -> list[tuple[tuple[torch.Tensor, torch.Tensor], list[torch.Tensor]]]:
        """Samples scored as packed rows (:func:`~envrl.agents.choose.score_candidate_sets`), each
        its prompt, then its candidates (choose mode) or its response (generate mode), then its
        ``branches`` (rows that begin with its prompt) as more candidates. Per sample, its units
        and their entropies as :meth:`logprobs` gives them: ``log pi(choice | s)`` and the entropy
        of ``pi(. | s)``, or each response token's log-prob at ``temperature`` and its entropy;
        and its branches' response log-probs (temperature 1)."""
        items, froms, temps = [], [], []
        for s, extra in zip(samples, branches):
            start = len(s.prompt_ids)
            own = list(s.candidate_ids) if s.candidate_ids is not None else [list(s.response_ids)]
            items.append((s.prompt_ids, own + [list(b.prompt_ids[start:]) + list(b.response_ids) for b in extra]))
            froms.append([0] * len(own) + [len(b.prompt_ids) - start for b in extra])
            # choose mode applies the temperature to the candidates' summed scores, not to their tokens
            temps.append([1.0 if s.candidate_ids is not None else temperature] * len(own) + [1.0] * len(extra))
        out = []
        entropy = any(s.candidate_ids is None for s in samples)  # token entropies: generate mode's only
        scored = score_candidate_sets(model, items, self.backend.pad_id, froms, temps, entropy=entropy)
        for sample, extra, result in zip(samples, branches, scored):
            grid, entropies = result if entropy else (result, None)
            count = len(sample.candidate_ids) if sample.candidate_ids is not None else 1
            responses = [grid[count + j, : len(b.response_ids)] for j, b in enumerate(extra)]
            if sample.candidate_ids is None:
                assert entropies is not None
                size = len(sample.response_ids)
                out.append(((grid[0, :size], entropies[0, :size]), responses))
                continue
            assert sample.choice is not None
            scores = candidate_scores(grid[:count], sample.candidate_ids, self.config.choose_score)
            log_probs = choice_distribution(scores, temperature)
            choice_entropy = -(log_probs.exp() * log_probs).sum()
            out.append(((log_probs[sample.choice].reshape(1), choice_entropy.reshape(1)), responses))
        return out

    def _temperature(self) -> float:
        return self.config.temperature if self.config.temperature > 0 else 1.0

    # ---- saving ----------------------------------------------------------------------------

    def save(self, directory: Path) -> Path:
        """A plain transformers checkpoint (LoRA adapters merged in) that ``hf:DIR`` loads."""
        directory.mkdir(parents=True, exist_ok=True)
        with self._merged() as model:
            model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        return directory

    @contextmanager
    def _merged(self) -> Iterator[Any]:
        """The model to save: itself, or with LoRA a copy with the adapters merged into the weights
        (the trained model keeps its adapters)."""
        model = self.unwrapped
        if self.config.lora_rank == 0:
            yield model
            return
        merged = copy.deepcopy(model).merge_and_unload()
        try:
            yield merged
        finally:
            del merged

    def train_mode(self, training: bool) -> Any:
        """Switch train/eval mode (no dropout while acting); returns a no-op context for ``with``."""
        self.unwrapped.train(training)
        return nullcontext()


def extends(branch: ScoredSample, sample: ScoredSample) -> bool:
    """Whether ``branch``'s prompt begins with all of ``sample``'s (it can share its packed row)."""
    start = len(sample.prompt_ids)
    return len(branch.prompt_ids) >= start and list(branch.prompt_ids[:start]) == list(sample.prompt_ids)


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """How many tokens all ``rows`` share from the start."""
    if not rows:
        return 0
    shortest = min(len(row) for row in rows)
    for k in range(shortest):
        token = rows[0][k]
        if any(row[k] != token for row in rows):
            return k
    return shortest


def shared_start(samples: Sequence[ScoredSample]) -> int:
    """The tokens :meth:`Policy.shared_prefix_logprobs` computes once for ``samples``: their rows'
    common start, short of the shortest prompt's last token (so every sample keeps a token of its
    prompt to predict its response's first token from)."""
    rows = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    return max(0, min([common_prefix_length(rows)] + [len(s.prompt_ids) - 1 for s in samples]))


def token_bounds(tokenizer: Any, text: str, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Each of ``ids`` (``text``'s tokens, no special tokens) as the characters ``[begin, end)`` of
    ``text`` it writes: a fast tokenizer's offsets, else the lengths of the decoded prefixes."""
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(encoded["input_ids"]) == list(ids):
            return [(int(begin), int(stop)) for begin, stop in encoded["offset_mapping"]]
    if tokenizer.decode(list(ids), clean_up_tokenization_spaces=False) != text:
        raise ValueError(
            f"the tokenizer does not decode its tokens of {text!r} back to it: cannot place its characters"
        )
    bounds, begin = [], 0
    for k in range(len(ids)):
        # max: a prefix that ends inside a character decodes it as a replacement character
        stop = max(begin, len(tokenizer.decode(list(ids[: k + 1]), clean_up_tokenization_spaces=False)))
        bounds.append((begin, stop))
        begin = stop
    return bounds


def _pad(rows: Sequence[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> Scores:
    width = max((len(lp) for lp, _ in rows), default=0) or 1
    logprobs = torch.zeros((len(rows), width), device=device)
    entropy = torch.zeros((len(rows), width), device=device)
    mask = torch.zeros((len(rows), width), device=device)
    for i, (lp, ent) in enumerate(rows):
        n = len(lp)
        if n:
            logprobs = logprobs.index_put((torch.full((n,), i, device=device), torch.arange(n, device=device)), lp)
            entropy = entropy.index_put((torch.full((n,), i, device=device), torch.arange(n, device=device)), ent)
            mask[i, :n] = 1.0
    return Scores(logprobs=logprobs, mask=mask, entropy=entropy)


def _device(device: str) -> str:
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def _dtype(dtype: str, device: str) -> Any:
    if dtype == "auto":
        return torch.float32 if device == "cpu" else "auto"
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(names)}")
    return names[dtype]
