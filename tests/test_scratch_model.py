"""The from-scratch checkpoint (envrl.training.scratch_model): deterministic files that load with
transformers, ChatML, EOS order, exact parameter counts, and a tokenizer trained on env text."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from envrl.envs import REGISTRY  # noqa: E402
from envrl.training import scratch_model  # noqa: E402
from envrl.training.scratch_model import (  # noqa: E402
    BUILD_RECORD,
    builtin_corpus,
    corpus_tasks,
    default_corpus_envs,
    env_corpus,
    init_model,
)


def files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def layer_parameters(hidden, kv_dim, intermediate):
    """One Qwen2 decoder layer: q/k/v with biases, o without, a gated MLP, two RMSNorms."""
    return (
        (hidden * hidden + hidden)
        + 2 * (hidden * kv_dim + kv_dim)
        + hidden * hidden
        + 3 * hidden * intermediate
        + 2 * hidden
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return init_model(tmp_path_factory.mktemp("tiny"), "tiny")


def test_tiny_is_the_same_bytes_for_a_seed(tiny, tmp_path):
    again = init_model(tmp_path / "again", "tiny")
    assert files(again) == files(tiny)
    assert set(files(tiny)) == {
        "chat_template.jinja",
        "config.json",
        BUILD_RECORD,
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    other = files(init_model(tmp_path / "seed1", "tiny", seed=1))
    assert other["model.safetensors"] != files(tiny)["model.safetensors"]
    assert other["tokenizer.json"] != files(tiny)["tokenizer.json"]  # the built-in corpus is seeded too


def test_tiny_loads_and_speaks_chatml(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokenizer.eos_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == [2, 0]  # <|im_end|> first: trainers append it
    assert model.config.eos_token_id == 0
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "go to cabinet 1"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\ngo to cabinet 1<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids[0] == 1 and ids.count(2) == 2  # the special tokens are single ids
    # the reloaded tokenizer splits text exactly as the one trained here
    trained = scratch_model.train_tokenizer(builtin_corpus(), 1024, model_max_length=512)
    text = "You arrive at cabinet 3. On the cabinet 3, you see a mug 2.\n<action>take mug 2 from cabinet 3</action>"
    assert tokenizer(text).input_ids == trained(text).input_ids
    assert tokenizer.decode(tokenizer(text).input_ids) == text


def test_sizes_and_parameter_counts(tiny, tmp_path):
    record = json.loads((tiny / BUILD_RECORD).read_text())
    vocab = record["architecture"]["vocab_size"]
    assert record["size"] == "tiny" and record["seed"] == 0 and record["corpus"]["source"] == "builtin"
    assert record["corpus"]["texts"] == 600
    # hidden 64, 4 heads of 16, 2 KV heads (kv 32), MLP 128, 2 layers, untied head
    assert record["parameters"] == 2 * layer_parameters(64, 32, 128) + 64 + 2 * vocab * 64 == 74_304 + 128 * vocab
    small = init_model(tmp_path / "small", "small", envs=())  # the built-in corpus: no env play
    config = json.loads((small / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["max_position_embeddings"]) == (192, 4, 2048)
    assert config["tie_word_embeddings"] is True
    small_record = json.loads((small / BUILD_RECORD).read_text())
    small_vocab = small_record["architecture"]["vocab_size"]
    # hidden 192, 6 heads of 32, 2 KV heads (kv 64), MLP 512, 4 layers, tied embeddings
    assert small_record["parameters"] == 4 * layer_parameters(192, 64, 512) + 192 + small_vocab * 192
    assert 1_000_000 < small_record["parameters"] < 3_000_000


def test_refuses_bad_input(tiny, tmp_path):
    with pytest.raises(FileExistsError):
        init_model(tiny, "tiny")
    with pytest.raises(ValueError, match="unknown model size"):
        init_model(tmp_path / "x", "huge")
    with pytest.raises(ValueError, match="vocab_size must be at least 259"):
        init_model(tmp_path / "x", "tiny", vocab_size=100)


@pytest.fixture(scope="module")
def tw_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("textworld-cache")


def test_corpus_is_env_text_in_the_prompt_format(tw_cache):
    """One TextWorld game (tw-custom:train:0, generated on first use, ~3 s), expert and random."""
    import gymnasium as gym

    import envrl  # noqa: F401  (registers the ids)

    played = []
    texts = env_corpus(
        ("textworld",), tasks={"textworld": 1}, env_kwargs={"textworld": {"cache_dir": tw_cache}}, played=played
    )
    assert [(e.agent, e.task_id, e.seed, e.success) for e in played] == [
        ("expert", "tw-custom:train:0", 0, True),
        ("random", "tw-custom:train:0", 0, False),
    ]
    assert played[0].steps == 3 and played[1].steps == 25  # the walkthrough; the random agent's step limit
    env = gym.make("envrl/TextWorld-v0", split="train", cache_dir=tw_cache)
    first, _ = env.reset(options={"task_id": "tw-custom:train:0"})
    env.close()
    users = [t for t in texts if t.startswith("user\n")]
    assert all(first in t for t in users[:2])  # turn 1 of each template shows the game's own text
    assert "assistant\n<action>go east</action>" in texts  # the action template's response
    assert "assistant\n<think></think><action>go east</action>" in texts  # think-action's
    # 3 + 25 steps, 2 templates, 3 texts a step (system, user, assistant)
    assert len(texts) == (3 + 25) * 2 * 3
    assert env_corpus(("textworld",), tasks={"textworld": 1}, env_kwargs={"textworld": {"cache_dir": tw_cache}}) == (
        texts
    )


def test_env_trained_tokenizer_is_compact_on_env_prompts(tw_cache, tiny, tmp_path):
    from transformers import AutoTokenizer

    folder = init_model(
        tmp_path / "tw",
        "tiny",
        envs=("textworld",),
        tasks={"textworld": 1},
        env_kwargs={"textworld": {"cache_dir": tw_cache}},
    )
    record = json.loads((folder / BUILD_RECORD).read_text())
    assert record["corpus"]["envs"] == ["textworld"] and len(record["corpus"]["episodes"]) == 2
    assert record["corpus"]["templates"] == ["action", "think-action"]
    prompt = env_corpus(("textworld",), tasks={"textworld": 1}, env_kwargs={"textworld": {"cache_dir": tw_cache}})[1]
    env_tokens = len(AutoTokenizer.from_pretrained(folder)(prompt).input_ids)
    builtin_tokens = len(AutoTokenizer.from_pretrained(tiny)(prompt).input_ids)
    assert env_tokens < 0.75 * builtin_tokens
    assert AutoTokenizer.from_pretrained(folder).tokenize("assistant\n<action>go east</action>")[:2] == [
        "assistant",
        "Ċ",
    ]


def test_command_line(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    scratch_model.add_arguments(parser)
    assert scratch_model.run(parser.parse_args([str(tmp_path / "m"), "--size", "tiny", "--seed", "3"])) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {tmp_path / 'm'}: tiny Qwen2, ") and "built-in" in out
    assert json.loads((tmp_path / "m" / BUILD_RECORD).read_text())["seed"] == 3
    assert scratch_model.run(parser.parse_args([str(tmp_path / "m")])) == 2  # not empty
    assert "is not empty" in capsys.readouterr().err


def test_the_default_corpus_envs_are_the_descriptors_with_a_position_in_its_order():
    assert default_corpus_envs() == ("textworld", "alfworld")  # what the sizes other than tiny play
    swapped = dict(REGISTRY)
    swapped["textworld"] = dataclasses.replace(REGISTRY["textworld"], default_corpus_position=1)
    swapped["alfworld"] = dataclasses.replace(REGISTRY["alfworld"], default_corpus_position=0)
    swapped["webshop"] = dataclasses.replace(REGISTRY["webshop"], default_corpus_position=5)
    assert default_corpus_envs(swapped) == ("alfworld", "textworld", "webshop")


def test_the_corpus_plays_as_many_tasks_as_the_descriptor_says(tw_cache, monkeypatch):
    assert [corpus_tasks(name) for name in ("textworld", "alfworld", "webshop", "scienceworld")] == [6, 12, 8, 3]
    assert corpus_tasks("diag-chain") == 4 and corpus_tasks("plugin.module:Toy-v0") == 4  # the default
    monkeypatch.setitem(REGISTRY, "textworld", dataclasses.replace(REGISTRY["textworld"], corpus_tasks=1))
    played = []
    env_corpus(("textworld",), env_kwargs={"textworld": {"cache_dir": tw_cache}}, played=played)
    assert [(e.agent, e.task_id) for e in played] == [("expert", "tw-custom:train:0"), ("random", "tw-custom:train:0")]
