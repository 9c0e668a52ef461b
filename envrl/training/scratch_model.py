"""A small causal LM built from scratch, for training on CPUs (``envrl model init``).

No pretrained causal LM can be installed offline, so CPU experiments start from a randomly
initialised Qwen2-architecture model with a byte-level BPE tokenizer trained here. The
tokenizer is trained on the text the policy will read and write: episodes of envrl's envs
(expert and random agents, train split) rendered through envrl's own prompt templates and
response format, so prompts and responses tokenize into few tokens. The folder is an ordinary
``save_pretrained`` checkpoint: ``envrl eval --agent hf:DIR`` and the trainers load it like any
other.

Sizes (:data:`SIZES`): ``tiny`` (hidden 64, 2 layers; built in about a second from a fixed,
generated corpus: the tests' checkpoint) and ``small`` (hidden 192, 4 layers, ~2M parameters,
2,048 positions; the CPU experiments' model).

Tokens: ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>`` are ids 0, 1 and 2; the chat
template is ChatML (as Qwen's, without a default system prompt). The generation config's EOS
ids are ``[<|im_end|>, <|endoftext|>]``, ``<|im_end|>`` first because trainers end each
response with the first EOS id, which is what the chat template closes a turn with. The saved
tokenizer names no pad token: back ends and trainers choose their own.

Determinism: the same arguments give the same files, byte for byte (the envs replay the same
episodes for a seed, and both the tokenizer's training and the weights' initialisation are
seeded). ``envrl_model.json`` in the folder records how the checkpoint was built.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envrl.envs import REGISTRY
from envrl.envs.descriptor import DEFAULT_CORPUS_TASKS, EnvDescriptor

#: the special tokens, in this order, so that their ids are 0, 1, 2
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: a ChatML template like Qwen's, without the system-prompt default
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: how text is split into words before BPE: the GPT-style pattern Qwen2 uses (single digits,
#: letter runs, punctuation runs, whitespace). transformers rebuilds a ``qwen2`` checkpoint's
#: tokenizer with this pattern when it loads it, so training with it keeps the two identical.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: the file that records how a checkpoint was built
BUILD_RECORD = "envrl_model.json"


@dataclass(frozen=True)
class ModelSize:
    """The architecture of one size (a Qwen2 config) and its tokenizer's default vocabulary."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    vocab_size: int
    tie_word_embeddings: bool


SIZES = {
    # the tests' checkpoint: untied, so a test can zero the output layer alone
    "tiny": ModelSize(64, 128, 2, 4, 2, 512, 1024, False),
    # CPU experiments: ~1.9M parameters (1.6M in the layers, the rest the tied embedding)
    "small": ModelSize(192, 512, 4, 6, 2, 2048, 2048, True),
}

#: the templates every step is rendered with: the policy's prompt formats
CORPUS_TEMPLATES = ("action", "think-action")
#: step limit of the random agent's episodes (its later steps add little new text)
RANDOM_STEP_LIMIT = 25
#: turns of history in the rendered prompts (the agents' default)
CORPUS_HISTORY = 2


# ---- corpora ---------------------------------------------------------------------------------


def default_corpus_envs(registry: Mapping[str, EnvDescriptor] = REGISTRY) -> tuple[str, ...]:
    """The envs whose episodes train the tokenizer of the sizes other than ``tiny``: those whose
    descriptor gives a ``default_corpus_position``, in that order (textworld, then alfworld)."""
    placed = [
        (d.default_corpus_position, name) for name, d in registry.items() if d.default_corpus_position is not None
    ]
    return tuple(name for _, name in sorted(placed))


def corpus_tasks(name: str, registry: Mapping[str, EnvDescriptor] = REGISTRY) -> int:
    """How many tasks of env ``name`` the corpus plays: its descriptor's ``corpus_tasks``
    (:data:`~envrl.envs.descriptor.DEFAULT_CORPUS_TASKS` for an env played by id that has none)."""
    return registry[name].corpus_tasks if name in registry else DEFAULT_CORPUS_TASKS


def builtin_corpus(lines: int = 600, seed: int = 0) -> list[str]:
    """A few hundred lines in the style of ALFWorld, WebShop and ScienceWorld transcripts.

    Generated from templates with a seeded RNG, so the corpus (and hence the tokenizer) is
    the same on every run without playing any env: the ``tiny`` size's corpus, built in
    milliseconds for tests.
    """
    rng = random.Random(seed)
    out: list[str] = [
        "You are an expert agent operating in a household. Think step by step, then act.",
        "Respond with <think>your reasoning</think><action>one admissible action</action>.",
        "Nothing happens.",
        "search[gluten free snack bars]",
        "click[buy now]",
        "Your task is to boil water. First, focus on the substance.",
    ]
    while len(out) < lines:
        room = rng.choice(_ROOMS)
        rec = rng.choice(_RECEPTACLES)
        num = rng.randint(1, 9)
        obj = rng.choice(_OBJECTS)
        seen = ", ".join(f"a {rng.choice(_RECEPTACLES)} {rng.randint(1, 9)}" for _ in range(rng.randint(2, 6)))
        attr = rng.choice(_ATTRIBUTES)
        kind = rng.randrange(10)
        if kind == 0:
            out.append(f"You are in the middle of a room. Looking quickly around you, you see {seen}.")
        elif kind == 1:
            out.append(f"Your task is to: {rng.choice(_VERBS)} some {obj} and put it in {rec}.")
        elif kind == 2:
            out.append(
                rng.choice(
                    [
                        f"go to {rec} {num}",
                        f"open {rec} {num}",
                        f"take {obj} {num} from {rec} {num}",
                        f"move {obj} {num} to {rec} {num}",
                        "look",
                        "inventory",
                    ]
                )
            )
        elif kind == 3:
            out.append(f"On the {rec} {num}, you see a {obj} {rng.randint(1, 3)}, and a {rng.choice(_OBJECTS)} 1.")
        elif kind == 4:
            out.append(
                f"<think>I need to find a {obj} first. It may be in the {rec} {num}.</think>"
                f"<action>go to {rec} {num}</action>"
            )
        elif kind == 5:
            product = rng.choice(_PRODUCTS)
            out.append(f"Instruction: i need {product}, and price lower than {rng.randint(10, 90)}.00 dollars")
            out.append(f"search[{product}]")
        elif kind == 6:
            out.append(f"This room is called the {room}. In it, you see: {seen}. You also see: a door to the hallway.")
        elif kind == 7:
            out.append(f"You arrive at {rec} {num}. The {rec} {num} is closed.")
        elif kind == 8:
            out.append(
                f"<think>{rng.choice(_THOUGHTS)}; the {attr} {obj} is a candidate.</think>"
                f"<action>examine {attr} {obj}</action>"
            )
        else:
            sub = rng.choice(_SUBSTANCES)
            out.append(
                f"The {sub} is in the {attr} {rng.choice(['pot', 'beaker', 'cup', 'jug'])}. "
                f"Its temperature is {rng.randint(-20, 120)} degrees celsius."
            )
            price = f"${rng.randint(5, 99)}.{rng.randint(0, 99):02d}"
            out.append(f"[SEP] {rng.choice(_PRODUCTS).title()} [SEP] {price} [SEP]")
    return out[:lines]


_ROOMS = ("kitchen", "bathroom", "bedroom", "living room", "hallway", "workshop", "greenhouse")
_RECEPTACLES = (
    *("cabinet", "countertop", "drawer", "fridge", "microwave", "sinkbasin", "shelf", "garbagecan"),
    *("coffeemachine", "stoveburner", "toaster", "desk", "dresser", "sidetable", "bed", "sofa"),
)
_OBJECTS = (
    *("mug", "apple", "knife", "plate", "bowl", "cup", "egg", "potato", "tomato", "lettuce", "book", "pen"),
    *("pencil", "cellphone", "keychain", "vase", "spoon", "fork", "bread", "towel"),
)
_VERBS = ("clean", "heat", "cool", "examine", "put", "find two")
_PRODUCTS = (
    *("long clear glass jar", "gluten free snack bars", "men's running shoes", "wireless earbuds"),
    *("organic green tea", "cotton bed sheets", "stainless steel water bottle", "hair dryer"),
    *("vegan protein powder", "waterproof hiking boots", "bluetooth speaker", "ceramic coffee mug"),
    *("leather wallet", "yoga mat", "lavender scented candle", "noise cancelling headphones"),
)
_ATTRIBUTES = ("small", "large", "red", "blue", "black", "white", "green", "wooden", "metal", "plastic")
_SUBSTANCES = ("water", "ice", "salt", "sugar", "orange juice", "soap", "sodium chloride", "steam")
_THOUGHTS = (
    "I should check the closed receptacles one by one",
    "the task is done once the object is inside the target",
    "that location was empty, so I will try the next one",
    "heating requires the microwave, cooling requires the fridge",
    "the price must stay below the budget in the instruction",
    "I have to focus on the substance before changing its state",
)


@dataclass(frozen=True)
class CorpusEpisode:
    """One episode played for the corpus (recorded in the build record)."""

    env: str
    agent: str
    task_id: str
    seed: int
    steps: int
    success: bool


def env_corpus(
    envs: Sequence[str],
    *,
    seed: int = 0,
    split: str = "train",
    tasks: Mapping[str, int] | None = None,
    templates: Sequence[str] = CORPUS_TEMPLATES,
    history: int = CORPUS_HISTORY,
    env_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    played: list[CorpusEpisode] | None = None,
) -> list[str]:
    """Text the policy will read and write, from episodes of ``envs`` on ``split``.

    For each env, its first ``tasks[env]`` tasks (default: :func:`corpus_tasks`) are played by
    the expert and by a random agent (seeded ``seed + i``, at most :data:`RANDOM_STEP_LIMIT`
    steps), through ``gym.make``. Every step is rendered with each of ``templates`` exactly as
    an LLM agent builds its prompt (:class:`~envrl.agents.prompts.Conversation`): each message
    and the response that gives the step's action, as ``role + "\n" + content``, the text that
    follows ``<|im_start|>`` in the chat template (the special tokens are never split, so the
    corpus leaves them out). ``env_kwargs`` maps an env's short name to extra ``gym.make``
    arguments (e.g. TextWorld's ``cache_dir``). ``played``, when given, receives one
    :class:`CorpusEpisode` per episode.
    """
    import gymnasium as gym

    from envrl.agents import make_agent
    from envrl.agents.prompts import Conversation, load_template
    from envrl.evaluation.config import resolve_env

    loaded = [load_template(name) for name in templates]
    texts: list[str] = []
    for env in envs:
        name, env_id = resolve_env(env)
        count = (tasks or {}).get(name, corpus_tasks(name))
        for spec in ("expert", "random"):
            agent = make_agent(spec, name, seed=seed)
            kwargs: dict[str, Any] = {**getattr(agent, "env_kwargs", {}), **(env_kwargs or {}).get(name, {})}
            if spec == "random":
                kwargs.setdefault("max_episode_steps", RANDOM_STEP_LIMIT)
            game: Any = gym.make(env_id, split=split, **kwargs)
            try:
                for i, task_id in enumerate(list(game.unwrapped.task_ids)[:count]):
                    conversations = [Conversation(template, name, history) for template in loaded]
                    observation, info = game.reset(seed=seed + i, options={"task_id": task_id})
                    agent.reset(seed=seed + i)
                    steps, done = 0, False
                    while not done:
                        action = agent.act(observation, info)
                        for conversation in conversations:
                            messages = conversation.messages(observation, info)
                            texts.extend(f"{m['role']}\n{m['content']}" for m in messages)
                            texts.append(f"assistant\n{conversation.template.format_response(action)}")
                            conversation.record(observation, action)
                        observation, _, terminated, truncated, info = game.step(action)
                        steps, done = steps + 1, terminated or truncated
                    if played is not None:
                        played.append(CorpusEpisode(name, spec, task_id, seed + i, steps, bool(info.get("success"))))
            finally:
                game.close()
    return texts


# ---- tokenizer and model ---------------------------------------------------------------------


def train_tokenizer(
    texts: Sequence[str], vocab_size: int, *, chat_template: bool = True, model_max_length: int = 2048
) -> Any:
    """A byte-level BPE tokenizer (Qwen2's pre-tokenizer split) trained on ``texts``, as a
    ``PreTrainedTokenizerFast`` with the special tokens and (by default) the ChatML template.

    Byte-level: every string encodes, whatever the corpus held. A corpus too small for
    ``vocab_size`` gives a smaller vocabulary (every word of it becomes one token).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=model_max_length,
    )
    if chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_model(size: ModelSize, vocab_size: int, seed: int, *, eos_ids: Sequence[int], eot_id: int) -> Any:
    """A randomly initialised ``Qwen2ForCausalLM`` of ``size`` (float32), its weights drawn
    from ``seed`` without touching the global RNG, with a generation config ending at ``eos_ids``.

    The model config names ``eot_id`` (``<|endoftext|>``) as BOS and EOS whatever ``eos_ids``
    are, so that ``config.json`` (and the weights' fingerprint) does not depend on the chat
    template; generation reads the generation config."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_key_value_heads,
        max_position_embeddings=size.max_position_embeddings,
        tie_word_embeddings=size.tie_word_embeddings,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=None,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    eos: int | list[int] = list(eos_ids) if len(eos_ids) > 1 else eos_ids[0]
    model.generation_config = GenerationConfig(bos_token_id=eot_id, eos_token_id=eos)
    return model


def init_model(
    out_dir: str | Path,
    size: str = "tiny",
    *,
    envs: Sequence[str] | None = None,
    seed: int = 0,
    vocab_size: int | None = None,
    chat_template: bool = True,
    tasks: Mapping[str, int] | None = None,
    env_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a from-scratch checkpoint of ``size`` (``tiny`` or ``small``) into ``out_dir``.

    ``envs``: the envs whose episodes train the tokenizer (see :func:`env_corpus`; ``tasks``
    and ``env_kwargs`` go there); an empty sequence uses :func:`builtin_corpus` instead (no env
    is played); None means the size's default: ``()`` for ``tiny``, :func:`default_corpus_envs`
    otherwise. ``vocab_size`` defaults to the size's. ``chat_template=False`` leaves the
    tokenizer without a template (and ``<|endoftext|>`` the only EOS id), for tests of
    plain-text prompts. A non-empty ``out_dir`` is refused unless ``overwrite``.
    """
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}")
    spec = SIZES[size]
    envs = tuple(envs) if envs is not None else (() if size == "tiny" else default_corpus_envs())
    vocab = spec.vocab_size if vocab_size is None else int(vocab_size)
    if vocab < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 256} (the bytes and special tokens)")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} is not empty; choose an empty or new directory")

    played: list[CorpusEpisode] = []
    if envs:
        texts = env_corpus(envs, seed=seed, tasks=tasks, env_kwargs=env_kwargs, played=played)
    else:
        texts = builtin_corpus(seed=seed)
    tokenizer = train_tokenizer(
        texts, vocab, chat_template=chat_template, model_max_length=spec.max_position_embeddings
    )
    eot, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    eos_ids = [im_end, eot] if chat_template else [eot]
    model = build_model(spec, len(tokenizer), seed, eos_ids=eos_ids, eot_id=eot)

    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    with _quiet_transformers():
        model.save_pretrained(out)
    corpus_bytes = "\n".join(texts).encode("utf-8")
    record = {
        "built_by": "envrl.training.scratch_model",
        "size": size,
        "seed": seed,
        "architecture": asdict(spec) | {"vocab_size": len(tokenizer)},
        "parameters": sum(p.numel() for p in model.parameters()),
        "chat_template": chat_template,
        "eos_token_ids": eos_ids,
        "corpus": {
            "source": "envs" if envs else "builtin",
            "envs": list(envs),
            "templates": list(CORPUS_TEMPLATES) if envs else [],
            "episodes": [asdict(e) for e in played],
            "texts": len(texts),
            "chars": sum(len(t) for t in texts),
            "sha256": hashlib.sha256(corpus_bytes).hexdigest(),
        },
    }
    (out / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return out


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No "Writing model shards" progress bar for a one-file checkpoint (restored after)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


# ---- command line ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``envrl model init DIR``."""
    parser.add_argument("dir", help="the new checkpoint's directory (must be empty or new)")
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny", help="tiny (tests) or small (CPU runs)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the corpus (default 0)")
    parser.add_argument(
        "--envs",
        default=None,
        help="comma-separated envs whose episodes train the tokenizer, or 'none' for a fixed built-in "
        f"corpus (default: none for tiny, {','.join(default_corpus_envs())} otherwise)",
    )
    parser.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary (default: the size's)")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty directory")


def run(args: argparse.Namespace) -> int:
    """``envrl model init``: build the checkpoint and say what was built; 2 on bad input."""
    envs: tuple[str, ...] | None = None
    if args.envs is not None:
        envs = tuple(e.strip() for e in args.envs.split(",") if e.strip() and e.strip().lower() != "none")
    start = time.perf_counter()
    try:
        out = init_model(
            args.dir, args.size, envs=envs, seed=args.seed, vocab_size=args.vocab_size, overwrite=args.overwrite
        )
    except (ValueError, FileExistsError) as exc:
        print(f"envrl model init: error: {exc}", file=sys.stderr)
        return 2
    record = json.loads((out / BUILD_RECORD).read_text(encoding="utf-8"))
    corpus = record["corpus"]
    source = f"{len(corpus['episodes'])} episodes of {', '.join(corpus['envs'])}" if corpus["envs"] else "built-in"
    print(
        f"wrote {out}: {record['size']} Qwen2, {record['parameters']:,} parameters, "
        f"vocabulary {record['architecture']['vocab_size']} (tokenizer trained on {source} text, "
        f"{corpus['chars']:,} characters) in {time.perf_counter() - start:.1f} s"
    )
    return 0
