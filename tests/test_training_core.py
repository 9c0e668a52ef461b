"""The training core without envs: choose-mode scoring, response log-probs and masks, configs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from envrl.agents.choose import length_buckets, score_candidates  # noqa: E402
from envrl.agents.generation import SamplingConfig  # noqa: E402
from envrl.agents.hf import HFBackend  # noqa: E402
from envrl.training.algorithms import GRPOConfig, SFTConfig, algorithm_class  # noqa: E402
from envrl.training.checkpoints import check_output  # noqa: E402
from envrl.training.config import ConfigError, PolicyConfig, build_config  # noqa: E402
from envrl.training.policy import Policy, common_prefix_length, extends, scored_units, shared_start  # noqa: E402
from envrl.training.rollout import StepSample  # noqa: E402

MESSAGES = [{"role": "system", "content": "You play."}, {"role": "user", "content": "You see a door. Go?"}]
CANDIDATES = ["<action>go north</action>", "<action>open door</action>", "<action>look</action>"]


def _direct_scores(model, prompt_ids, candidates):
    """Each candidate's summed token log-probs from its own full forward pass (no shared cache)."""
    out = []
    for tokens in candidates:
        ids = torch.tensor([list(prompt_ids) + list(tokens)])
        with torch.no_grad():
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        out.append(sum(float(log_probs[len(prompt_ids) - 1 + j, t]) for j, t in enumerate(tokens)))
    return out


def test_packed_scoring_of_many_prompts_matches_each_candidate_scored_alone(tiny_checkpoint: Path, monkeypatch) -> None:
    """Prompts of different lengths, candidates split over rows and rows over forward passes:
    every candidate's token log-probs equal those of its own forward pass after its prompt alone."""
    from envrl.agents import choose

    backend = HFBackend(str(tiny_checkpoint), device="cpu")
    model = backend._model
    prompts = [backend.encode(MESSAGES), backend.encode(MESSAGES[:1]), backend.encode(MESSAGES)[:7]]
    candidates = [[backend.encode_response(c) for c in CANDIDATES * k] for k in (1, 2, 3)]
    monkeypatch.setattr(choose, "CANDIDATE_CHUNK", 2)  # rows of at most 2 candidates, the prompt repeated
    monkeypatch.setattr(choose, "CPU_PACKED_TOKENS", 120)  # several forward passes
    items = list(zip(prompts, candidates))
    scored = choose.score_candidate_sets(model, items, backend.pad_id)
    for (prompt, options), grid in zip(items, scored):
        assert grid.shape == (len(options), max(len(o) for o in options))
        for row, tokens in enumerate(options):
            ids = torch.tensor([list(prompt) + list(tokens)])
            with torch.no_grad():
                alone = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            expected = [float(alone[len(prompt) - 1 + j, t]) for j, t in enumerate(tokens)]
            assert grid[row, : len(tokens)].tolist() == pytest.approx(expected, abs=1e-4)
            assert bool((grid[row, len(tokens) :] == 0).all())
    # the scores keep the graph: a choice's log-prob has gradients for the model's weights
    grid = choose.score_candidate_sets(model, items[:1], backend.pad_id)[0]
    torch.log_softmax(grid.sum(1), 0)[1].backward()
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters())
    with pytest.raises(ValueError, match="at least one candidate"):
        choose.score_candidate_sets(model, [(prompts[0], [])], backend.pad_id)
    # score_from: the tokens before it are context, scored from there on (a mixed row: one candidate
    # from its first token, one from its fourth, one from its last)
    options = candidates[1][:3]
    with torch.no_grad():
        grid = choose.score_candidate_sets(
            model, [(prompts[0], options)], backend.pad_id, [[0, 3, len(options[2]) - 1]]
        )[0]
        full = choose.score_candidate_sets(model, [(prompts[0], options)], backend.pad_id)[0]
    for row, start in enumerate([0, 3, len(options[2]) - 1]):
        n = len(options[row]) - start
        assert grid[row, :n].tolist() == pytest.approx(full[row, start : start + n].tolist(), abs=1e-5)
    assert grid.shape == (3, len(options[0]))
    with pytest.raises(ValueError, match="within it"):
        choose.score_candidate_sets(model, [(prompts[0], options)], backend.pad_id, [[0, 0, len(options[2])]])


def test_choose_scores_match_a_direct_computation_and_probabilities_sum_to_one(tiny_checkpoint: Path) -> None:
    backend = HFBackend(str(tiny_checkpoint), device="cpu")
    generation = backend.choose([MESSAGES], [CANDIDATES], SamplingConfig(temperature=1.0, seed=5))[0]
    assert generation.error is None and generation.choice is not None
    options = generation.candidate_token_ids
    assert options == [backend.encode_response(c) for c in CANDIDATES]
    assert all(o[-1] == backend.stop_ids[0] for o in options)  # the end-of-turn token is scored too
    with torch.no_grad():
        shared = score_candidates(backend._model, generation.prompt_token_ids, options, backend.pad_id).sum(1)
    direct = _direct_scores(backend._model, generation.prompt_token_ids, options)
    assert shared.tolist() == pytest.approx(direct, abs=1e-4)
    log_probs = torch.log_softmax(shared, dim=0)
    assert float(log_probs.exp().sum()) == pytest.approx(1.0, abs=1e-6)
    assert generation.choice_logprob == pytest.approx(float(log_probs[generation.choice]), abs=1e-5)
    assert generation.text == CANDIDATES[generation.choice]
    # greedy picks the best-scored candidate; the same seed picks the same candidate again
    greedy = backend.choose([MESSAGES], [CANDIDATES], SamplingConfig(temperature=0.0))[0]
    assert greedy.choice == int(torch.argmax(shared))
    again = backend.choose([MESSAGES], [CANDIDATES], SamplingConfig(temperature=1.0, seed=5))[0]
    assert again.choice == generation.choice
    # length-normalised scores: each candidate's mean token log-prob
    mean = backend.choose([MESSAGES], [CANDIDATES], SamplingConfig(temperature=1.0, seed=5), score="mean")[0]
    normalised = torch.tensor([d / len(o) for d, o in zip(direct, options)])
    assert mean.choice_logprob == pytest.approx(float(torch.log_softmax(normalised, 0)[mean.choice]), abs=1e-5)


def test_choose_without_admissible_actions_fails_that_prompt_only(tiny_checkpoint: Path) -> None:
    backend = HFBackend(str(tiny_checkpoint), device="cpu")
    out = backend.choose([MESSAGES, MESSAGES], [[], CANDIDATES], SamplingConfig(temperature=0.0))
    assert out[0].error is not None and "admissible" in out[0].error
    assert out[1].error is None


def _sample(prompt, response, candidates=None, choice=None) -> StepSample:
    return StepSample(
        prompt_ids=prompt,
        response_ids=response,
        old_logprobs=[],
        candidate_ids=candidates,
        choice=choice,
        action="",
        reward=0.0,
        observation="",
        next_observation="",
        anchor="",
        valid=True,
        env_valid=True,
        done=False,
        truncated=False,
        group_id=0,
        trajectory_id=0,
        step=0,
        task_id="t",
    )


def test_policy_scores_response_tokens_only_and_choices_as_one_unit(tiny_checkpoint: Path) -> None:
    policy = Policy(PolicyConfig(model=str(tiny_checkpoint), device="cpu", temperature=1.0), "textworld")
    prompt = policy.encode_prompt(MESSAGES)
    short, long = policy.encode_response("<action>look</action>"), policy.encode_response("<action>go north</action>")
    candidates = [short, long]
    samples = [_sample(prompt, long), _sample(prompt[:-3], short), _sample(prompt, short, candidates, 1)]
    with torch.no_grad():
        scores = policy.logprobs(samples)
    # masks: exactly the response tokens (or the one choice), nothing of the prompt or the padding
    assert scores.mask.sum(1).tolist() == [len(long), len(short), 1]
    assert [scored_units(s) for s in samples] == [len(long), len(short), 1]
    model = policy.unwrapped
    for row, sample in enumerate(samples[:2]):
        ids = torch.tensor([sample.prompt_ids + sample.response_ids])
        with torch.no_grad():
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        expected = [float(log_probs[len(sample.prompt_ids) - 1 + j, t]) for j, t in enumerate(sample.response_ids)]
        n = len(sample.response_ids)
        assert scores.logprobs[row, :n].tolist() == pytest.approx(expected, abs=1e-4)
        assert scores.logprobs[row, n:].abs().sum() == 0
    direct = _direct_scores(model, prompt, candidates)
    expected_choice = direct[1] - math.log(sum(math.exp(d) for d in direct))
    assert float(scores.logprobs[2, 0]) == pytest.approx(expected_choice, abs=1e-4)
    policy.config.choose_score = "mean"
    with torch.no_grad():
        mean = policy.logprobs(samples[2:]).logprobs
    normalised = [d / len(c) for d, c in zip(direct, candidates)]
    expected_mean = normalised[1] - math.log(sum(math.exp(d) for d in normalised))
    assert float(mean[0, 0]) == pytest.approx(expected_mean, abs=1e-4)
    policy.config.choose_score = "sum"
    # gradients flow to the weights through both kinds of units
    loss = -(policy.logprobs(samples).logprobs.sum())
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_length_buckets_bound_the_padding_and_keep_every_row_once() -> None:
    lengths = [500, 150, 160, 520, 155, 280, 150]
    buckets = length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    assert buckets == [[1, 6, 4, 2], [5], [0, 3]]  # the 150s with 160, 280 alone, 500 with 520
    for bucket in buckets:
        padded = len(bucket) * max(lengths[i] for i in bucket)
        assert padded <= 1.25 * sum(lengths[i] for i in bucket)
    assert length_buckets([]) == [] and length_buckets([7, 7, 7]) == [[0, 1, 2]]
    assert length_buckets([10, 100], slack=100.0) == [[0, 1]]  # a loose bound pads as one batch did


def test_forward_batches_split_length_groups_at_the_devices_token_budget() -> None:
    from envrl.agents.choose import CPU_PACKED_TOKENS, PACKED_TOKENS, forward_batches

    assert (CPU_PACKED_TOKENS, PACKED_TOKENS) == (2048, 16384)
    lengths = [500] * 9 + [3000]  # one group of nine 500s (4500 tokens), and a row longer than the CPU budget
    cpu = forward_batches(lengths, torch.device("cpu"))
    assert cpu == [[0, 1, 2, 3], [4, 5, 6, 7], [8], [9]]  # 4 x 500 fit in 2048, a 3000-token row runs alone
    assert forward_batches(lengths, torch.device("cuda")) == [list(range(9)), [9]]
    assert forward_batches(lengths, "cpu") == cpu


def test_responses_of_very_different_lengths_score_as_each_alone(tiny_checkpoint: Path) -> None:
    """Rows run in several length groups (short rows not padded to the longest), and each row's
    log-probs come back in the caller's order, as the row scored alone."""
    policy = Policy(PolicyConfig(model=str(tiny_checkpoint), device="cpu", temperature=1.0), "textworld")
    prompt = policy.encode_prompt(MESSAGES)
    long_response = policy.encode_response(" ".join(["open the box"] * 30))
    samples = [_sample(prompt, long_response), _sample(prompt[-8:], [5, 6]), _sample(prompt + prompt, [7])]
    assert len(length_buckets([len(s.prompt_ids) + len(s.response_ids) for s in samples])) == 3
    with torch.no_grad():
        together = policy.logprobs(samples)
        for row, sample in enumerate(samples):
            alone = policy.logprobs([sample]).logprobs[0]
            n = len(sample.response_ids)
            assert together.mask[row].sum() == n
            assert together.logprobs[row, :n].tolist() == pytest.approx(alone[:n].tolist(), abs=1e-5)


def test_rows_that_share_a_prefix_score_as_each_alone_with_its_gradient(tiny_checkpoint: Path) -> None:
    """A group's shared start is computed once (one packed row), and every response token gets
    the log-prob and the gradient it gets when its row runs alone; a group with no common token
    and a group of one run each row on its own."""
    policy = Policy(PolicyConfig(model=str(tiny_checkpoint), device="cpu", temperature=2.0), "textworld")
    prompt = policy.encode_prompt(MESSAGES)
    assert common_prefix_length([[4, 5, 6], [4, 5, 7, 8], [4, 5]]) == 2
    assert common_prefix_length([[4, 5], [6]]) == 0 and common_prefix_length([[4, 5], [4, 5]]) == 2
    groups = [
        [  # shares the prompt but its last token, then branches of different lengths
            _sample(prompt, policy.encode_response("<action>open the box</action>")),
            _sample(prompt[:-1] + [9, 10, 11], policy.encode_response("You open the box.")),
            _sample(prompt, [12]),  # the same prompt: the shared part stops at the prompt's end
        ],
        [_sample([20, 21, 22], [23, 24]), _sample([25, 21], [26])],  # nothing in common
        [_sample(prompt[-6:], [30, 31, 32])],
    ]
    # computed once: the common start, short of the shortest prompt's last token
    assert [shared_start(g) for g in groups] == [len(prompt) - 1, 0, 5]
    assert shared_start([_sample(prompt, [12]), _sample(prompt, [12])]) == len(prompt) - 1
    flat = [s for group in groups for s in group]
    packed = policy.shared_prefix_logprobs(groups)
    assert [len(row) for group in packed for row in group] == [len(s.response_ids) for s in flat]
    for group, rows in zip(groups, packed):
        for sample, row in zip(group, rows):
            alone = policy.logprobs([sample], temperature=1.0).logprobs[0, : len(sample.response_ids)]
            assert row.tolist() == pytest.approx(alone.tolist(), abs=1e-5)
    # the gradient of a loss through the packed rows is the one through the rows alone
    weights = [float(k + 1) for k in range(len(flat))]
    params = [p for p in policy.unwrapped.parameters() if p.requires_grad]
    packed_loss = sum(w * row.sum() for w, row in zip(weights, (r for g in packed for r in g)))
    packed_grads = torch.autograd.grad(packed_loss, params)
    alone_loss = sum(w * policy.logprobs([s], temperature=1.0).logprobs[0].sum() for w, s in zip(weights, flat))
    alone_grads = torch.autograd.grad(alone_loss, params)
    for a, b in zip(packed_grads, alone_grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_branches_that_continue_a_prompt_join_its_row_and_score_as_alone(tiny_checkpoint: Path) -> None:
    """Rows that begin with a step's whole prompt are scored in the step's packed row (a
    generated-mode step's response then one more candidate, at the rollout temperature, with its
    entropies); any other row with its step's other rows; each step's units and entropies and each
    row's tokens get the values and gradients they get scored alone."""
    policy = Policy(
        PolicyConfig(model=str(tiny_checkpoint), device="cpu", temperature=2.0, action_mode="choose"), "textworld"
    )
    prompt = policy.encode_prompt(MESSAGES)
    candidates = [policy.encode_response(c) for c in CANDIDATES]
    chosen = _sample(prompt, candidates[1], candidates, 1)
    generated = _sample(prompt[:-2] + [40], policy.encode_response("<action>look</action>"))
    follow = _sample(prompt + candidates[0] + [41, 42], policy.encode_response("You see a hall."))
    at_end = _sample(prompt, policy.encode_response("<action>look</action>"))  # no context of its own
    other = _sample([43] + prompt[1:], [44, 45])  # begins elsewhere
    plain = _sample(prompt[:-1], policy.encode_response("<action>open door</action>"))  # no branch joins it
    steps = [chosen, generated, plain]
    branches = [
        [follow, other, at_end],
        [_sample(generated.prompt_ids + [46], [47, 48]), _sample([49, 50], [51])],
        [_sample([52], [53])],
    ]
    assert [extends(b, chosen) for b in branches[0]] == [True, False, True]
    scores, rows = policy.logprobs_with_branches(steps, branches)
    alone = policy.logprobs(steps)
    assert torch.allclose(scores.logprobs, alone.logprobs, atol=1e-5) and torch.equal(scores.mask, alone.mask)
    assert torch.allclose(scores.entropy, alone.entropy, atol=1e-5)
    flat = [b for row in branches for b in row]
    values = [v for row in rows for v in row]
    assert [len(v) for v in values] == [len(b.response_ids) for b in flat]
    for sample, row in zip(flat, values):
        single = policy.logprobs([sample], temperature=1.0).logprobs[0, : len(sample.response_ids)]
        assert row.tolist() == pytest.approx(single.tolist(), abs=1e-5)
    weights = [float(k + 2) for k in range(len(flat))]
    params = [p for p in policy.unwrapped.parameters() if p.requires_grad]
    joint = scores.logprobs.sum() + sum(w * v.sum() for w, v in zip(weights, values))
    joint_grads = torch.autograd.grad(joint, params)
    apart = policy.logprobs(steps).logprobs.sum()
    apart = apart + sum(w * policy.logprobs([b], temperature=1.0).logprobs[0].sum() for w, b in zip(weights, flat))
    for a, b in zip(joint_grads, torch.autograd.grad(apart, params)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="3 samples need as many lists of branches, got 1"):
        policy.logprobs_with_branches(steps, [[]])


def test_temperature_divides_the_logits(tiny_checkpoint: Path) -> None:
    hot = Policy(PolicyConfig(model=str(tiny_checkpoint), device="cpu", temperature=2.0), "textworld")
    prompt = hot.encode_prompt(MESSAGES)
    response = hot.encode_response("<action>look</action>")
    with torch.no_grad():
        at_two = hot.logprobs([_sample(prompt, response)]).logprobs[0, : len(response)]
        at_one = hot.logprobs([_sample(prompt, response)], temperature=1.0).logprobs[0, : len(response)]
        logits = hot.unwrapped(input_ids=torch.tensor([prompt + response])).logits[0].float()
    positions = range(len(prompt) - 1, len(prompt) - 1 + len(response))
    expected = [float(torch.log_softmax(logits[p] / 2.0, -1)[t]) for p, t in zip(positions, response)]
    assert at_two.tolist() == pytest.approx(expected, abs=1e-4)
    assert not torch.allclose(at_one, at_two)


# ---- configuration -------------------------------------------------------------------------------


def _config(algo: str = "grpo", **kwargs):
    return build_config(algo, "textworld", algorithm_config=algorithm_class(algo).Config, **kwargs)


def test_config_layers_and_types(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("optim:\n  lr: 3.0e-4\nrollout:\n  group_size: 4\nalgorithm:\n  norm: mean\n")
    config = _config(files=[file], overrides={"updates": 7}, sets=["optim.lr=1e-3"])
    assert config.optim.lr == 1e-3  # --set wins over the file; YAML's "1e-3" string is read as a float
    assert config.rollout.group_size == 4 and config.algorithm.norm == "mean" and config.updates == 7
    assert config.rollout.max_steps == 50  # from the shipped configs/grpo/textworld.yaml
    assert isinstance(config.algorithm, GRPOConfig)
    with pytest.raises(ConfigError, match="algorithm.gamma"):  # GRPO has no gamma; GiGPO does
        _config(sets=["algorithm.gamma=0.5"])
    assert _config("gigpo", sets=["algorithm.gamma=0.5"]).algorithm.gamma == 0.5


@pytest.mark.parametrize(
    "sets, message",
    [
        (["optim.learning_rate=1"], "unknown config key 'optim.learning_rate'.*keys of section 'optim': lr"),
        (["optimizer.lr=1"], "unknown config section 'optimizer'"),
        (["optim.lr=fast"], "takes a float"),
        (["updates"], "takes key=value"),
        (["rollout=1"], "is a section"),
    ],
)
def test_config_errors_say_what_to_change(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(sets=sets)


def test_unknown_algorithm_and_small_groups_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown algorithm 'ppo'; choose one of sft, grpo, gigpo"):
        algorithm_class("ppo")
    config = _config(sets=["rollout.group_size=1"])
    with pytest.raises(ConfigError, match="group_size must be at least 2, got 1"):
        algorithm_class("grpo")(config.algorithm).check(config)


def test_sft_without_data_says_how_to_make_it() -> None:
    config = _config("sft")
    assert isinstance(config.algorithm, SFTConfig)
    with pytest.raises(ConfigError, match="envrl data expert --env textworld"):
        algorithm_class("sft")(config.algorithm).check(config)


def test_an_output_folder_of_another_config_is_refused(tmp_path: Path) -> None:
    check_output(tmp_path, _config(sets=[f"out={tmp_path}"]))
    check_output(tmp_path, _config(sets=[f"out={tmp_path}"]))  # the same config: resumable
    with pytest.raises(ConfigError, match=r"differs in: optim.lr.*use a new --out"):
        check_output(tmp_path, _config(sets=[f"out={tmp_path}", "optim.lr=0.5"]))


def test_a_run_continues_to_more_updates_only_when_nothing_depends_on_the_total(tmp_path: Path) -> None:
    def config(updates: int):
        return _config(sets=[f"out={tmp_path}", f"updates={updates}"])

    check_output(tmp_path, config(10))
    with pytest.raises(ConfigError, match="schedule spans the run.*cannot be continued"):
        check_output(tmp_path, config(20), extendable=False)
    check_output(tmp_path, config(20), extendable=True)
    check_output(tmp_path, config(20))  # the folder now says 20: resuming it needs nothing
    with pytest.raises(ConfigError, match="holds a run of 20 updates; updates=15 would not shorten it"):
        check_output(tmp_path, config(15), extendable=True)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    model.resize_token_embeddings(100)
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_checkpoint).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="saved with another tokenizer"):
        Policy(PolicyConfig(model=str(tmp_path), device="cpu"), "textworld")


def test_lora_trains_adapters_only_and_saves_a_plain_checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    policy = Policy(PolicyConfig(model=str(tiny_checkpoint), device="cpu", lora_rank=4, lora_alpha=8), "textworld")
    trainable = [name for name, p in policy.unwrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    prompt = policy.encode_prompt(MESSAGES)
    sample = _sample(prompt, policy.encode_response("<action>look</action>"))
    with torch.no_grad():
        for name, p in policy.unwrapped.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)  # adapters start as a no-op (B = 0): move them so the policy differs from the base
        trained = policy.logprobs([sample]).logprobs
        reference = policy.reference_logprobs([sample])  # the base model: adapters off
    base = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    with torch.no_grad():
        log_probs = torch.log_softmax(base(input_ids=ids).logits[0].float(), dim=-1)
    expected = [float(log_probs[len(prompt) - 1 + j, t]) for j, t in enumerate(sample.response_ids)]
    assert reference[0, : len(expected)].tolist() == pytest.approx(expected, abs=1e-4)
    assert not torch.allclose(trained, reference)
    saved = AutoModelForCausalLM.from_pretrained(policy.save(tmp_path / "merged"))  # adapters merged in
    with torch.no_grad():
        merged = torch.log_softmax(saved(input_ids=ids).logits[0].float(), dim=-1)
    got = [float(merged[len(prompt) - 1 + j, t]) for j, t in enumerate(sample.response_ids)]
    assert got == pytest.approx(trained[0, : len(got)].tolist(), abs=1e-4)


def test_a_second_run_into_the_same_output_folder_stops_at_start(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Two processes training into one folder would interleave checkpoints and metrics: the
    second stops with one sentence while the first holds the folder, and starts once it is closed."""
    from envrl.training.loop import Trainer

    def config():
        return build_config(
            "grpo",
            "textworld",
            algorithm_config=GRPOConfig,
            sets=[f"policy.model={tiny_checkpoint}", f"out={tmp_path / 'out'}", "policy.device=cpu"],
        )

    first = Trainer(config())
    try:
        with pytest.raises(ConfigError, match="another training run writes there"):
            Trainer(config())
    finally:
        first.close()
    Trainer(config()).close()


def test_a_process_whose_accelerator_autocasts_is_refused_not_followed(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """accelerate keeps one precision per process: after another library's bf16 Accelerator (a TRL
    trainer in the same notebook), a float32 run would silently autocast in bf16; it stops instead."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from envrl.training.loop import Trainer

    sets = [f"policy.model={tiny_checkpoint}", f"out={tmp_path / 'out'}", "policy.device=cpu"]
    config = build_config("grpo", "textworld", algorithm_config=GRPOConfig, sets=sets)
    fresh = Trainer(config)
    fresh.close()
    assert fresh.accelerator.mixed_precision == "no"  # float32, no autocast
    AcceleratorState._reset_state(reset_partial_state=True)  # as in a new process
    try:
        Accelerator(cpu=True, mixed_precision="bf16")
        with pytest.raises(ConfigError, match="mixed precision 'no'.*fixed it to 'bf16'; train in a fresh process"):
            Trainer(config)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_a_trainer_naming_a_missing_checkpoint_stops_at_start_with_one_sentence(tmp_path: Path) -> None:
    from envrl.training.loop import Trainer

    missing = tmp_path / "no-such-model"
    config = _config(sets=[f"out={tmp_path / 'run'}", f"policy.model={missing}"])
    with pytest.raises(
        ConfigError, match=f"^no checkpoint at {missing}: --model must name an existing checkpoint folder$"
    ):
        Trainer(config)
    assert not (tmp_path / "run").exists()  # refused before anything was written
