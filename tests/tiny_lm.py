"""A tiny, deterministic causal LM checkpoint for tests (no model hub, no network).

No small pretrained causal LM can be installed offline, so the tests that exercise the
transformers code paths (batching, chat templates, sampling, serving) build their own:
a byte-level BPE tokenizer trained on text like our environments produce, and a randomly
initialised two-layer Qwen2 model. The weights are random, so the text it writes is
gibberish, but it is a real ``save_pretrained`` checkpoint that ``from_pretrained`` loads
like any other, and it is the same bytes on every run (fixed seed, fixed corpus).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

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
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_ROOMS = ("kitchen", "bathroom", "bedroom", "living room", "hallway", "workshop", "greenhouse")
_RECEPTACLES = (
    "cabinet",
    "countertop",
    "drawer",
    "fridge",
    "microwave",
    "sinkbasin",
    "shelf",
    "garbagecan",
    "coffeemachine",
    "stoveburner",
    "toaster",
    "desk",
    "dresser",
    "sidetable",
    "bed",
    "sofa",
)
_OBJECTS = (
    "mug",
    "apple",
    "knife",
    "plate",
    "bowl",
    "cup",
    "egg",
    "potato",
    "tomato",
    "lettuce",
    "book",
    "pen",
    "pencil",
    "cellphone",
    "keychain",
    "vase",
    "spoon",
    "fork",
    "bread",
    "towel",
)
_VERBS = ("clean", "heat", "cool", "examine", "put", "find two")
_PRODUCTS = (
    "long clear glass jar",
    "gluten free snack bars",
    "men's running shoes",
    "wireless earbuds",
    "organic green tea",
    "cotton bed sheets",
    "stainless steel water bottle",
    "hair dryer",
    "vegan protein powder",
    "waterproof hiking boots",
    "bluetooth speaker",
    "ceramic coffee mug",
    "leather wallet",
    "yoga mat",
    "lavender scented candle",
    "noise cancelling headphones",
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


def corpus(lines: int = 600, seed: int = 0) -> list[str]:
    """A few hundred lines in the style of ALFWorld, WebShop and ScienceWorld transcripts.

    Generated from templates with a seeded RNG rather than stored, so the file stays short
    and the corpus (and hence the tokenizer) is identical on every run.
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


def build_tiny_checkpoint(path: Path, *, chat_template: bool = True, vocab_size: int = 1024) -> Path:
    """Train the tokenizer, build a 2-layer Qwen2 with seed 0, and ``save_pretrained`` both into ``path``.

    ``chat_template=False`` leaves the tokenizer without a template, so back ends fall back to
    plain text. The tokenizer has no pad token on purpose (back ends must set one). Greedy and
    EOS ids: ``<|endoftext|>`` is id 0 and the EOS; with a template ``<|im_end|>`` ends turns too.
    """
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
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
    bpe.train_from_iterator(corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=512,
    )
    if chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(path)

    eot, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=None,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[eot, im_end] if chat_template else eot)
    model.save_pretrained(path)
    (path / "tiny_lm.json").write_text(json.dumps({"built_by": "tests/tiny_lm.py", "chat_template": chat_template}))
    return path
