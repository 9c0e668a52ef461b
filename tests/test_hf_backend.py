"""HFBackend on a tiny random Qwen2 checkpoint (tests/tiny_lm.py): prompts, batching, sampling, bookkeeping."""

from __future__ import annotations

import hashlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from envrl.agents.generation import Backend, SamplingConfig  # noqa: E402
from envrl.agents.hf import HFBackend  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=24)
OBSERVATION = (
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, "
    "a countertop 2, a drawer 3, a fridge 1, and a sinkbasin 1."
)


def chat(user: str, system: str = "You are an expert agent. Answer with <action>...</action>.") -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


PROMPTS = [
    chat("go to cabinet 1"),
    chat(OBSERVATION * 4 + "\nYour task is to: put a clean mug in coffeemachine."),
    chat("take apple 1 from countertop 2"),
    chat(OBSERVATION),
    chat("Instruction: i need a long clear glass jar, and price lower than 30.00 dollars"),
]


@pytest.fixture(scope="module")
def backend(tiny_checkpoint) -> HFBackend:
    b = HFBackend(str(tiny_checkpoint), max_batch_size=16)
    yield b
    b.close()


@pytest.fixture(scope="module")
def plain_backend(tiny_checkpoint_plain) -> HFBackend:
    b = HFBackend(str(tiny_checkpoint_plain))
    yield b
    b.close()


def test_is_a_backend(backend):
    assert isinstance(backend, Backend)
    assert backend.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert backend.dtype == "float32"  # the checkpoint's dtype, and "auto" on CPU is float32 anyway


def test_render_with_chat_template(backend):
    text = backend.render([{"role": "system", "content": "S"}, {"role": "user", "content": "go to cabinet 1"}])
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\ngo to cabinet 1<|im_end|>\n<|im_start|>assistant\n"
    )
    rendered = backend.render(PROMPTS[0])
    assert backend.encode(PROMPTS[0]) == backend.tokenizer(rendered, add_special_tokens=False).input_ids


def test_render_without_chat_template(plain_backend):
    assert not plain_backend.has_chat_template
    assert plain_backend.render(chat("go to cabinet 1", system="S")) == "S\n\ngo to cabinet 1\n"
    gen = plain_backend.generate([chat("look")], SamplingConfig(max_new_tokens=4))[0]
    assert gen.error is None
    assert gen.prompt_tokens == len(plain_backend.tokenizer(plain_backend.render(chat("look"))).input_ids)


def test_token_counts_match_the_tokenizer(backend):
    gens = backend.generate(PROMPTS, GREEDY)
    for messages, gen in zip(PROMPTS, gens):
        expected = len(backend.tokenizer(backend.render(messages), add_special_tokens=False).input_ids)
        assert gen.prompt_tokens == expected  # no padding counted
        assert gen.error is None and gen.finish_reason in ("stop", "length")
        if gen.finish_reason == "length":
            assert gen.completion_tokens == GREEDY.max_new_tokens


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=3)])
def test_generations_keep_their_tokens_and_logprobs(backend, sampling):
    """Token ids and log-probabilities equal a direct forward pass over prompt + response."""
    gens = backend.generate(PROMPTS, sampling)  # one padded batch
    temperature = sampling.temperature or 1.0
    for messages, gen in zip(PROMPTS, gens):
        assert gen.prompt_token_ids == backend.encode(messages)
        assert len(gen.token_ids) == len(gen.token_logprobs) == gen.completion_tokens
        stop = gen.token_ids[-1] in backend.stop_ids
        assert stop == (gen.finish_reason == "stop")
        body = gen.token_ids[:-1] if stop else gen.token_ids
        assert backend.tokenizer.decode(body, skip_special_tokens=True) == gen.text
        ids = torch.tensor([gen.prompt_token_ids + gen.token_ids])
        with torch.no_grad():
            logits = backend._model(ids).logits[0, len(gen.prompt_token_ids) - 1 : -1].float() / temperature
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]
        assert gen.token_logprobs == pytest.approx(expected.tolist(), abs=1e-4)
        if sampling is GREEDY:  # greedy picks the most likely token each time
            assert torch.equal(logits.argmax(-1), torch.tensor(gen.token_ids))


def test_greedy_output_does_not_depend_on_the_batch(backend, tiny_checkpoint):
    """Each prompt alone, all together (left-padded to the longest), and in pairs: same text."""
    alone = [backend.generate([p], GREEDY)[0] for p in PROMPTS]
    together = backend.generate(PROMPTS, GREEDY)
    pairs = HFBackend(str(tiny_checkpoint), max_batch_size=2).generate(list(reversed(PROMPTS)), GREEDY)[::-1]
    for a, b, c in zip(alone, together, pairs):
        assert a.text == b.text == c.text
        assert a.completion_tokens == b.completion_tokens == c.completion_tokens
        assert a.finish_reason == b.finish_reason == c.finish_reason
    assert len({g.text for g in alone}) > 1  # the prompts do steer the model


def test_padding_is_masked(backend, monkeypatch):
    """Guard for the test above: with padding visible to the model, batched text changes."""
    alone = backend.generate([PROMPTS[0]], GREEDY)[0].text
    real_generate = backend._model.generate

    def unmasked(**kwargs):
        kwargs["attention_mask"] = torch.ones_like(kwargs["attention_mask"])
        return real_generate(**kwargs)

    monkeypatch.setattr(backend._model, "generate", unmasked)
    assert backend.generate(PROMPTS, GREEDY)[0].text != alone


def test_seeded_sampling_is_repeatable(backend):
    before = torch.random.get_rng_state()
    a = backend.generate(PROMPTS, SamplingConfig(temperature=1.0, max_new_tokens=16, seed=7))
    b = backend.generate(PROMPTS, SamplingConfig(temperature=1.0, max_new_tokens=16, seed=7))
    c = backend.generate(PROMPTS, SamplingConfig(temperature=1.0, max_new_tokens=16, seed=8))
    assert torch.equal(before, torch.random.get_rng_state())  # the global RNG is left alone
    assert [g.text for g in a] == [g.text for g in b]
    assert [g.text for g in a] != [g.text for g in c]
    assert [g.text for g in a] != [g.text for g in backend.generate(PROMPTS, GREEDY)]
    for seed in (-1, 2**70):  # any Python int is a valid seed
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=2, seed=seed)
        assert backend.generate(PROMPTS[:1], sampling)[0].error is None


def test_top_p_is_applied(backend):
    """top_p close to 0 keeps only the most likely token, so sampling becomes greedy."""
    narrow = backend.generate(PROMPTS, SamplingConfig(temperature=1.0, top_p=1e-6, max_new_tokens=16, seed=1))
    greedy = backend.generate(PROMPTS, SamplingConfig(max_new_tokens=16))
    assert [g.text for g in narrow] == [g.text for g in greedy]


def test_max_new_tokens_gives_length(backend):
    gens = backend.generate(PROMPTS, SamplingConfig(max_new_tokens=5))
    assert all(g.finish_reason == "length" and g.completion_tokens == 5 for g in gens)


def test_eos_gives_stop(tiny_checkpoint):
    """With a zeroed output layer all logits tie and greedy picks id 0, <|endoftext|>."""
    b = HFBackend(str(tiny_checkpoint))
    with torch.no_grad():
        b._model.lm_head.weight.zero_()
    assert b.tokenizer.convert_ids_to_tokens(0) == "<|endoftext|>" and 0 in b.stop_ids
    gens = b.generate(PROMPTS[:2], SamplingConfig(max_new_tokens=8))
    assert [(g.text, g.finish_reason, g.completion_tokens) for g in gens] == [("", "stop", 1)] * 2


def test_mixed_stop_and_length_in_one_batch(backend, monkeypatch):
    """One prompt ends early (a stop id), its batch-mate runs on: counts and texts stay per prompt."""

    def greedy_ids(messages, n=12):
        ids = torch.tensor([backend.encode(messages)], device=backend.device)
        with torch.inference_mode():
            out = backend._model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                do_sample=False,
                eos_token_id=list(backend.stop_ids),
            )
        return out[0, ids.shape[1] :].tolist()

    first, second = greedy_ids(PROMPTS[0]), greedy_ids(PROMPTS[1])
    assert len(first) == len(second) == 12
    k = next(k for k in range(2, 12) if first[k] not in first[:k] and first[k] not in second)
    expected_second = backend.generate([PROMPTS[1]], SamplingConfig(max_new_tokens=12))[0]
    monkeypatch.setattr(backend, "stop_ids", (*backend.stop_ids, first[k]))
    a, b = backend.generate(PROMPTS[:2], SamplingConfig(max_new_tokens=12))
    assert (a.finish_reason, a.completion_tokens) == ("stop", k + 1)
    assert a.text == backend.tokenizer.decode(first[:k], skip_special_tokens=True)
    assert (b.finish_reason, b.completion_tokens, b.text) == ("length", 12, expected_second.text)


def test_long_prompt_keeps_its_end(backend):
    tail = OBSERVATION * 25  # longer than the context by itself
    long_a = chat("cabinet " * 3000 + tail)
    long_b = chat("drawer " * 2500 + tail)
    sampling = SamplingConfig(max_new_tokens=16)
    a, b = backend.generate([long_a, long_b], sampling)
    assert a.error is None and b.error is None
    assert a.prompt_tokens == b.prompt_tokens == backend.context_length - 16 == 496
    assert a.text == b.text  # only the (identical) last tokens were kept


def test_max_new_tokens_beyond_the_context(backend):
    gen = backend.generate([PROMPTS[1]], SamplingConfig(max_new_tokens=2000))[0]
    assert gen.error is None
    assert gen.prompt_tokens + gen.completion_tokens <= backend.context_length


def test_a_failing_batch_becomes_errors(tiny_checkpoint, monkeypatch):
    b = HFBackend(str(tiny_checkpoint), max_batch_size=2)

    def boom(**kwargs):
        if kwargs["input_ids"].shape[1] > 100:  # only the batch holding the long prompt
            raise RuntimeError("boom " + "x" * 5000)
        return real(**kwargs)

    real = b._model.generate
    monkeypatch.setattr(b._model, "generate", boom)
    gens = b.generate(PROMPTS, GREEDY)
    failed = [g for g in gens if g.error]
    assert len(failed) == 2  # the long prompt and its batch-mate; the other batches are fine
    assert all(g.finish_reason == "error" and g.text == "" and len(g.error) < 600 for g in failed)
    assert gens[1].error and "boom" in gens[1].error
    assert sum(g.error is None for g in gens) == 3


def test_out_of_memory_retries_in_halves(tiny_checkpoint, monkeypatch):
    b = HFBackend(str(tiny_checkpoint), max_batch_size=8)
    expected = b.generate(PROMPTS, GREEDY)
    real = b._model.generate

    def small_only(**kwargs):
        if kwargs["input_ids"].shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(**kwargs)

    monkeypatch.setattr(b._model, "generate", small_only)
    gens = b.generate(PROMPTS, GREEDY)
    assert [g.text for g in gens] == [g.text for g in expected]
    assert all(g.error is None and g.attempts >= 2 for g in gens)


def test_a_template_error_fails_only_that_prompt(backend):
    gens = backend.generate([PROMPTS[0], [{"role": "user"}]], GREEDY)  # no content: the template raises
    assert gens[0].error is None and gens[1].error and gens[1].finish_reason == "error"


def test_protocol(backend, plain_backend, tiny_checkpoint):
    p = backend.protocol()
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        digest.update(f"{name}\0{hashlib.sha256((tiny_checkpoint / name).read_bytes()).hexdigest()}\n".encode())
    assert p == {
        "backend": "hf",
        "model": str(tiny_checkpoint),
        "revision": None,
        "weights_sha256": digest.hexdigest(),
        "dtype": "float32",
        "device": backend.device,
        "chat_template": True,
        "context_length": 512,
        "max_batch_size": 16,
    }
    q = plain_backend.protocol()
    assert q["chat_template"] is False
    assert q["weights_sha256"] == p["weights_sha256"]  # same seed, same weights: the builder is deterministic


def test_bad_arguments(tiny_checkpoint):
    with pytest.raises(ValueError):
        HFBackend(str(tiny_checkpoint), dtype="int3")
    with pytest.raises(ValueError):
        HFBackend(str(tiny_checkpoint), max_batch_size=0)
