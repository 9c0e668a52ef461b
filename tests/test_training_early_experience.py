"""Early experience (IWM, SR): world-model prompts, loss masks, rationale writers, schedules, and
one tiny training iteration of each on every env.

The early-experience folders are written by hand here (no env is played): two expert steps of
one episode per env, prompts built by :class:`~envrl.agents.prompts.Conversation` as
``envrl data expert`` builds them, and two alternatives per expert state with made-up outcomes,
in the builder's schema. One slow test runs the whole pipeline on TextWorld: expert data, the
builder (:mod:`envrl.training.early_experience`), then IWM and SR.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("datasets")

from envrl.agents.generation import Generation  # noqa: E402
from envrl.agents.prompts import Conversation, TemplateError, load_template  # noqa: E402
from envrl.training.algorithms import IWM, SFT, SR, IWMConfig, SFTConfig, SRConfig, algorithm_class  # noqa: E402
from envrl.training.config import ConfigError, PolicyConfig, build_config  # noqa: E402
from envrl.training.data import collect_expert_data, to_dataset  # noqa: E402
from envrl.training.dynamics import (  # noqa: E402
    FollowUpTemplate,
    TargetSample,
    WorldModelTemplate,
    inverse_dynamics_sample,
    load_world_model_template,
)
from envrl.training.early_experience import build_early_experience, rollout_features  # noqa: E402
from envrl.training.early_experience_data import policy_messages  # noqa: E402
from envrl.training.loop import train  # noqa: E402
from envrl.training.losses import token_cross_entropy  # noqa: E402
from envrl.training.policy import Policy  # noqa: E402
from envrl.training.rationales import (  # noqa: E402
    ContrastWriter,
    ModelWriter,
    load_rationale_template,
    rationales_for,
    write_rationales,
)

#: per env: the task, the expert's observations s_0..s_2 and actions a_0, a_1, the admissible
#: actions at s_0 and s_1, and two alternatives (action, outcome) at each expert state
EPISODES: dict[str, dict[str, Any]] = {
    "textworld": {
        "instruction": "Take the key from the chest, then go east.",
        "observations": [
            "-= Cellar =-\nYou are in a cellar. There is a closed chest here. An exit leads east.",
            "You open the chest, revealing a key.",
            "You take the key from the chest.",
        ],
        "actions": ["open chest", "take key from chest"],
        "admissible": [["open chest", "go east", "look"], ["take key from chest", "close chest", "go east"]],
        "alternatives": [
            [("go east", "-= Hall =-\nYou are in a hall. An exit leads west."), ("look", "-= Cellar =-\nA cellar.")],
            [("close chest", "You close the chest."), ("go east", "-= Hall =-\nYou are in a hall.")],
        ],
    },
    "alfworld": {
        "instruction": "put a mug in coffeemachine.",
        "observations": [
            "You are in the middle of a room. Looking quickly around you, you see a cabinet 1 and a countertop 1.",
            "You arrive at countertop 1. On the countertop 1, you see a mug 1.",
            "You pick up the mug 1 from the countertop 1.",
        ],
        "actions": ["go to countertop 1", "take mug 1 from countertop 1"],
        "admissible": [["go to cabinet 1", "go to countertop 1", "look"], ["take mug 1 from countertop 1", "look"]],
        "alternatives": [
            [("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed."), ("look", "Nothing happens.")],
            [("look", "You are facing the countertop 1."), ("go to cabinet 1", "You arrive at cabinet 1.")],
        ],
    },
    "webshop": {
        "instruction": "i need red running shoes, and price lower than 50.00 dollars",
        "observations": [
            "WebShop [SEP] Instruction: [SEP] i need red running shoes [SEP] Search",
            "[Back to Search] [SEP] Page 1 [SEP] B0001 [SEP] Red Runner Shoe [SEP] $39.99",
            "[Back to Search] [SEP] < Prev [SEP] Red Runner Shoe [SEP] Price: $39.99 [SEP] Buy Now",
        ],
        "actions": ["search[red running shoes]", "click[b0001]"],
        "admissible": [["search[red running shoes]"], ["click[back to search]", "click[b0001]"]],
        "alternatives": [
            [
                ("search[shoes]", "[Back to Search] [SEP] Page 1 [SEP] B0009 [SEP] Blue Boot"),
                ("search[red]", "No results."),
            ],
            [("click[back to search]", "WebShop [SEP] Search"), ("click[next >]", "[Back to Search] [SEP] Page 2")],
        ],
    },
    "scienceworld": {
        "instruction": "Your task is to boil water.",
        "observations": [
            "This room is called the kitchen. In it, you see: a stove, a sink, a pot.",
            "You move the pot to the sink.",
            "The water is now in the pot.",
        ],
        "actions": ["move pot to sink", "activate sink"],
        "admissible": [["move pot to sink", "look around"], ["activate sink", "look around"]],
        "alternatives": [
            [("look around", "This room is called the kitchen."), ("activate stove", "The stove is now activated.")],
            [("look around", "This room is called the kitchen."), ("focus on pot", "You focus on the pot.")],
        ],
    },
}


def make_folder(env: str, folder: Path, template: str = "action", history: int = 1) -> Path:
    """An early-experience folder for ``env`` (see the module docstring)."""
    from datasets import Dataset

    episode = EPISODES[env]
    conversation = Conversation(load_template(template), env, history)
    observations, actions = episode["observations"], episode["actions"]
    expert, rollout = [], []
    for step, action in enumerate(actions):
        info = {"instruction": episode["instruction"], "admissible_actions": episode["admissible"][step]}
        messages = conversation.messages(observations[step], info)
        common = {"env": env, "split": "train", "task_id": f"{env}-task", "seed": 0, "episode": 0, "step": step}
        common |= {"instruction": episode["instruction"], "observation": observations[step]}
        done = step == len(actions) - 1
        expert.append(
            {
                **common,
                "messages": messages,
                "response": conversation.template.format_response(action),
                "action": action,
                "next_observation": observations[step + 1],
                "reward": float(done),
                "done": done,
                "admissible_actions": info["admissible_actions"],
            }
        )
        past = [{"observation": o, "action": a} for o, a in zip(observations[:step], actions[:step])]
        for j, (alternative, outcome) in enumerate(episode["alternatives"][step]):
            rollout.append(
                {
                    **common,
                    "alternative": j,
                    "history": past,
                    "messages": messages,
                    "admissible_actions": info["admissible_actions"],
                    "expert_action": action,
                    "expert_next_observation": observations[step + 1],
                    "expert_reward": float(done),
                    "action": alternative,
                    "next_observation": outcome,
                    "reward": 0.0,
                    "done": False,
                }
            )
        conversation.record(observations[step], action)
    folder.mkdir(parents=True, exist_ok=True)
    to_dataset(expert).to_parquet(str(folder / "expert.parquet"))
    Dataset.from_list(rollout, features=rollout_features()).to_parquet(str(folder / "rollout.parquet"))
    (folder / "meta.json").write_text(json.dumps({"env": env, "template": template, "history": history}))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``folders(env)``: the env's hand-made early-experience folder (made once per module)."""
    made: dict[str, Path] = {}

    def get(env: str) -> Path:
        if env not in made:
            made[env] = make_folder(env, tmp_path_factory.mktemp(f"early-{env}"))
        return made[env]

    return get


def _trainer(checkpoint: Path, template: str = "action", history: int = 1, updates: int = 4) -> SimpleNamespace:
    """What IWM and SR read from a trainer: the policy, the seed, the run's updates and the rank."""
    policy = Policy(PolicyConfig(model=str(checkpoint), device="cpu", template=template, history=history), "textworld")
    return SimpleNamespace(policy=policy, config=SimpleNamespace(seed=0, updates=updates), rank=0)


def _direct_loss(policy: Policy, sample: Any) -> float:
    """The token mean of -log p over the response's tokens, from one plain forward pass."""
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    with torch.no_grad():
        log_probs = torch.log_softmax(policy.unwrapped(input_ids=ids).logits[0].float(), dim=-1)
    start = len(sample.prompt_ids)
    picked = [float(log_probs[start - 1 + j, t]) for j, t in enumerate(sample.response_ids)]
    return -sum(picked) / len(picked)


# ---- world-model prompts ---------------------------------------------------------------------


def test_world_model_prompts_show_the_policys_window_of_the_state() -> None:
    sp = load_world_model_template("world-model")
    turns = [{"observation": "Cellar.", "action": "open chest"}, {"observation": "Chest open.", "action": "take key"}]
    messages = sp.state_prediction_messages("Get the key.", turns, "You hold the key.", "go east", history=1)
    assert messages == [
        {"role": "system", "content": "Predict what the text environment shows after the last action."},
        {"role": "user", "content": "Task: Get the key.\n\nChest open.\n> take key\n\nYou hold the key.\n> go east"},
    ]
    assert sp.state_prediction_messages("T", turns, "O", "a", history=0)[1]["content"] == "Task: T\n\nO\n> a"
    inverse = load_world_model_template("inverse-dynamics")
    messages = inverse.inverse_dynamics_messages("T", turns, "O", "P", history=5)
    assert messages[1]["content"] == (
        "Task: T\n\nCellar.\n> open chest\n\nChest open.\n> take key\n\nBefore:\nO\n\nAfter:\nP"
    )
    with pytest.raises(TemplateError, match="is a state-prediction template, not inverse-dynamics"):
        sp.inverse_dynamics_messages("T", turns, "O", "P")
    data = {"name": "x", "kind": "state-prediction", "system": "", "history_turn": "{observation}", "user": "{obs}"}
    with pytest.raises(TemplateError, match="user uses unknown fields obs"):
        WorldModelTemplate.from_dict(data)
    with pytest.raises(TemplateError, match="must show {action}"):
        WorldModelTemplate.from_dict({**data, "user": "{observation}"})


def test_follow_up_prompts_continue_the_policys_messages_and_never_show_their_target() -> None:
    policy_messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Task: T\n\nO"}]
    sp = load_world_model_template("follow-up-state-prediction")
    inverse = load_world_model_template("follow-up-inverse-dynamics")
    assert isinstance(sp, FollowUpTemplate) and (sp.kind, inverse.kind) == ("state-prediction", "inverse-dynamics")
    assert sp.state_prediction_messages(policy_messages, "<action>go east</action>") == [
        *policy_messages,
        {"role": "assistant", "content": "<action>go east</action>"},
        {"role": "user", "content": "What does the environment show next?"},
    ]
    assert inverse.inverse_dynamics_messages(policy_messages, "You are in a hall.", "<action>?</action>")[2:] == [
        {"role": "assistant", "content": "<action>?</action>"},
        {"role": "user", "content": "You are in a hall.\n\nWhich action is the '?'?"},
    ]
    with pytest.raises(TemplateError, match="is a state-prediction template, not inverse-dynamics"):
        sp.inverse_dynamics_messages(policy_messages, "P", "?")
    with pytest.raises(TemplateError, match="continues the policy's prompt messages, and none were given"):
        sp.state_prediction_messages([], "<action>go east</action>")
    data = {"name": "x", "kind": "inverse-dynamics", "form": "follow-up", "assistant": "{hidden_response}"}
    with pytest.raises(
        TemplateError, match="its assistant turn uses response, which inverse-dynamics follow-ups may not show"
    ):
        FollowUpTemplate.from_dict({**data, "assistant": "{response}", "user": "{next_observation}"})
    with pytest.raises(
        TemplateError, match="inverse-dynamics follow-ups must show {next_observation} in their user turn"
    ):
        FollowUpTemplate.from_dict({**data, "user": "What followed?"})
    leak = {"name": "y", "kind": "state-prediction", "form": "follow-up", "assistant": "{response}"}
    with pytest.raises(TemplateError, match="its user turn uses next_observation, which state-prediction follow-ups"):
        FollowUpTemplate.from_dict({**leak, "user": "It said {next_observation}. What next?"})
    with pytest.raises(TemplateError, match="lacks user"):
        FollowUpTemplate.from_dict(leak)


def test_inverse_dynamics_targets_the_actions_tokens_in_the_policys_response_format(tiny_checkpoint: Path) -> None:
    """The answer is tokenised whole, as the policy writes it; the tags before the action end the
    prompt and only the action's tokens are scored (the tiny tokenizer merges ``>`` into ``>go``)."""
    policy = _trainer(tiny_checkpoint).policy
    template = load_world_model_template("inverse-dynamics")
    sample = inverse_dynamics_sample(policy, template, "T", [], "O", "P", "go  east")
    answer = policy.encode_response("<action>go  east</action>")
    assert sample.prompt_ids == policy.encode_prompt(template.inverse_dynamics_messages("T", [], "O", "P")) + answer[:2]
    assert sample.response_ids == answer[2:-4]  # ">go", " ", " ", "e", "as", "t"


# ---- IWM -------------------------------------------------------------------------------------


def test_iwm_loss_covers_exactly_the_next_observation(tiny_checkpoint: Path, folders) -> None:
    trainer = _trainer(tiny_checkpoint)
    policy = trainer.policy
    iwm = IWM(IWMConfig(data=str(folders("textworld"))))
    iwm.prepare(trainer)
    assert len(iwm.world_model) == 4 and len(iwm.demonstrations) == 2
    # rollout row (step 1, alternative 0): s_1 with the one earlier turn the window shows, a = "close chest"
    sample = iwm.world_model[2]
    expected = [
        {"role": "system", "content": "Predict what the text environment shows after the last action."},
        {
            "role": "user",
            "content": "Task: Take the key from the chest, then go east.\n\n"
            "-= Cellar =-\nYou are in a cellar. There is a closed chest here. An exit leads east.\n> open chest\n\n"
            "You open the chest, revealing a key.\n> close chest",
        },
    ]
    target = list(policy.tokenizer("You close the chest.", add_special_tokens=False)["input_ids"])
    assert sample.prompt_ids == policy.encode_prompt(expected)
    assert sample.response_ids == target + [policy.end_id]
    with torch.no_grad():
        scores = policy.logprobs([sample], temperature=1.0)
        loss, terms = iwm.compute_loss(trainer, [sample])
    assert scores.mask.sum().item() == len(target) + 1  # the next observation and the end token, no prompt token
    assert float(loss) == pytest.approx(_direct_loss(policy, sample), abs=1e-5)
    assert terms == {"loss/world_model": pytest.approx(float(loss))}
    # the imitation prompts are rebuilt exactly as the expert data stored them
    assert [policy.encode_prompt(m) for m in _stored_messages(folders("textworld"))] == [
        d.prompt_ids for d in iwm.demonstrations
    ]


def _stored_messages(folder: Path) -> list[Any]:
    import pyarrow.parquet as pq

    return pq.read_table(folder / "expert.parquet").column("messages").to_pylist()


def test_two_stage_switches_at_the_rounded_fraction_and_then_is_sft(tiny_checkpoint: Path, folders) -> None:
    trainer = _trainer(tiny_checkpoint, updates=7)
    iwm = IWM(IWMConfig(data=str(folders("textworld")), batch_size=3, world_model_fraction=0.3))
    iwm.prepare(trainer)
    batches = [iwm.collect(trainer, update) for update in range(7)]
    assert iwm.switch_update(7) == 2  # round(0.3 * 7) = round(2.1)
    assert [b.metrics["stage"] for b in batches] == [1, 1, 2, 2, 2, 2, 2]
    assert all(isinstance(s, TargetSample) for b in batches[:2] for s in b.samples)
    sft = SFT(SFTConfig(batch_size=3))
    sft.demonstrations = iwm.demonstrations
    for k, batch in enumerate(batches[2:]):  # stage 2 draws SFT's own batches, from SFT's first update on
        assert batch.samples == sft.collect(trainer, k).samples
        assert batch.metrics["epoch"] == sft.collect(trainer, k).metrics["epoch"]
    trainer.config.updates = 5
    assert iwm.switch_update(5) == 2  # round(1.5), Python's round half to even
    iwm.config.world_model_fraction = 0.5
    assert iwm.switch_update(5) == 2 and iwm.switch_update(4) == 2 and iwm.switch_update(7) == 4


def test_two_stage_restarts_the_learning_rate_schedule_for_imitation() -> None:
    """Each stage gets warmup and cosine decay over its own updates (hand-computed values)."""
    from envrl.training.config import TrainConfig
    from envrl.training.loop import lr_schedule

    config = TrainConfig(algo="iwm", env="textworld", updates=6)
    config.optim.schedule, config.optim.warmup_updates = "cosine", 1
    iwm = IWM(IWMConfig(world_model_fraction=0.5))
    assert iwm.stage_starts(6) == [0, 3]
    lr = lr_schedule(config, iwm.stage_starts(6))
    # per stage of 3 updates: warmup 1/1, then cosine over the remaining 2: 0.5 * (1 + cos(pi * k / 2))
    assert [round(lr(step), 6) for step in range(6)] == [1.0, 1.0, 0.5, 1.0, 1.0, 0.5]
    assert [round(lr_schedule(config)(step), 6) for step in range(6)] == [
        1.0,
        1.0,
        0.904508,
        0.654508,
        0.345492,
        0.095492,
    ]
    assert IWM(IWMConfig(schedule="mixed")).stage_starts(6) == [0]
    assert IWM(IWMConfig(world_model_fraction=1.0)).stage_starts(6) == [0]


def test_mixed_batches_hold_both_kinds_and_weigh_the_world_model(tiny_checkpoint: Path, folders) -> None:
    trainer = _trainer(tiny_checkpoint)
    config = IWMConfig(data=str(folders("textworld")), batch_size=4, schedule="mixed", world_model_weight=0.25)
    iwm = IWM(config)
    iwm.prepare(trainer)
    batch = iwm.collect(trainer, 0)
    kinds = [getattr(s, "kind", "sft") for s in batch.samples]
    assert kinds == ["sft", "sft", "state_prediction", "state_prediction"] and batch.metrics["stage"] == 0
    with torch.no_grad():
        loss, terms = iwm.compute_loss(trainer, batch.samples)
        scores = trainer.policy.logprobs(batch.samples, temperature=1.0)
    sft_mask, wm_mask = scores.mask.clone(), scores.mask.clone()
    sft_mask[2:], wm_mask[:2] = 0, 0
    sft_loss = float(token_cross_entropy(scores.logprobs, sft_mask))
    wm_loss = float(token_cross_entropy(scores.logprobs, wm_mask))
    assert terms == {
        "loss/sft": pytest.approx(sft_loss, abs=1e-6),
        "loss/world_model": pytest.approx(wm_loss, abs=1e-6),
    }
    assert float(loss) == pytest.approx(sft_loss + 0.25 * wm_loss, abs=1e-5)
    iwm.config.world_model_fraction = 0.9  # round(3.6) = 4 would leave no imitation: one is kept
    assert [getattr(s, "kind", "sft") for s in iwm.collect(trainer, 1).samples].count("sft") == 1
    # objective choice: the imitation term is SFT's choice loss, one unit per step, beside the world model's tokens
    iwm.config.objective, iwm.config.world_model_fraction = "choice", 0.5
    iwm.prepare(trainer)
    samples = iwm.collect(trainer, 0).samples
    with torch.no_grad():
        _, terms = iwm.compute_loss(trainer, samples)
        scores = trainer.policy.logprobs(samples, temperature=1.0)
    assert scores.mask.sum(1)[:2].tolist() == [1.0, 1.0]
    assert terms["loss/sft"] == pytest.approx(-float(scores.logprobs[:2, 0].mean()), abs=1e-6)


def test_expert_transitions_join_the_world_model_only_when_asked(tiny_checkpoint: Path, folders) -> None:
    trainer = _trainer(tiny_checkpoint)
    iwm = IWM(IWMConfig(data=str(folders("textworld")), expert_transitions=True))
    iwm.prepare(trainer)
    assert len(iwm.world_model) == 6
    # after the 4 rollout rows, the expert's (s_0, a_0, s_1): s_1 is the target
    assert iwm.world_model[4].response_ids == trainer.policy.encode_response("You open the chest, revealing a key.")
    assert IWM(IWMConfig(data=str(folders("textworld")))).config.expert_transitions is False


# ---- SR ----------------------------------------------------------------------------------------


def test_contrast_writer_is_a_fixed_text_of_both_outcomes() -> None:
    row = {
        "instruction": "Take the key.",
        "observation": "You are in a cellar.",
        "expert_action": "open chest",
        "expert_next_observation": "You open the chest,\n  revealing a key.",
        "action": "go east",
        "next_observation": "-= Hall =-\nYou are in a hall. " + "It is long. " * 20,
    }
    writer = ContrastWriter(load_rationale_template())
    assert writer.write([row]) == [
        'Doing "go east" leads to: "-= Hall =- You are in a hall. It is long. It is long. It is long. It is long. '
        'It is long. It is long..." Doing "open chest" leads to: "You open the chest, revealing a key." '
        'So "open chest" is the better action.'
    ]


def test_sr_loss_covers_exactly_the_rationale_and_the_action(tiny_checkpoint: Path, folders) -> None:
    trainer = _trainer(tiny_checkpoint, template="think-action")
    policy = trainer.policy
    sr = SR(SRConfig(data=str(folders("textworld")), batch_size=4))
    sr.prepare(trainer)
    assert len(sr.reflections) == 4 and len(sr.demonstrations) == 2 and sr.left_out == 0
    sample = sr.reflections[0]  # step 0, alternative 0 ("go east")
    rationale = (
        'Doing "go east" leads to: "-= Hall =- You are in a hall. An exit leads west." '
        'Doing "open chest" leads to: "You open the chest, revealing a key." So "open chest" is the better action.'
    )
    episode = EPISODES["textworld"]
    info = {"instruction": episode["instruction"], "admissible_actions": episode["admissible"][0]}
    prompt = Conversation(load_template("think-action"), "textworld", 1).messages(episode["observations"][0], info)
    assert sample.prompt_ids == policy.encode_prompt(prompt)
    response = f"<think>{rationale}</think><action>open chest</action>"
    tokens = list(policy.tokenizer(response, add_special_tokens=False)["input_ids"])
    assert sample.response_ids == tokens + [policy.end_id]
    with torch.no_grad():
        scores = policy.logprobs([sample], temperature=1.0)
        loss, terms = sr.compute_loss(trainer, [sample])
    assert scores.mask.sum().item() == len(tokens) + 1
    assert float(loss) == pytest.approx(_direct_loss(policy, sample), abs=1e-5)
    assert set(terms) == {"loss/reflection"}
    # plain expert samples: the expert's action with an empty thought, from the prompt the policy sees
    assert sr.demonstrations[0].response_ids == policy.encode_response("<think></think><action>open chest</action>")
    assert sr.demonstrations[0].prompt_ids == sample.prompt_ids
    batch = sr.collect(trainer, 0)
    assert [getattr(s, "kind", "sft") for s in batch.samples] == ["reflection", "reflection", "sft", "sft"]
    # objective choice: the expert samples become the expert's action among the admissible ones
    choice = SR(SRConfig(data=str(folders("textworld")), batch_size=4, objective="choice"))
    choice.prepare(trainer)
    demo = choice.demonstrations[0]
    admissible = episode["admissible"][0]
    assert demo.candidate_ids == [
        policy.encode_response(f"<think></think><action>{action}</action>") for action in admissible
    ]
    assert admissible[demo.choice] == "open chest"
    assert choice.reflections[0].response_ids == sample.response_ids


def test_saved_rationales_are_used_when_their_writer_matches(tiny_checkpoint: Path, tmp_path: Path) -> None:
    folder = make_folder("alfworld", tmp_path / "data")

    class Backend:
        """A model writer's back end whose second request fails after its retries."""

        def generate(self, prompts, sampling, seeds=None):
            assert sampling.temperature == 0.0
            texts = ["It is closer.", None, "  The mug\n is there. ", "<action>look</action>"]
            return [
                Generation(text="", error="timeout after 5 attempts") if t is None else Generation(text=t)
                for t in texts
            ]

        def close(self) -> None:
            pass

    writer = ModelWriter("openai:judge", Backend(), load_rationale_template())
    path = write_rationales(folder, writer)
    assert path == folder / "rationales.parquet" and not list(folder.glob(".*tmp"))
    assert writer.dropped == 2  # the failed request and the reply holding an <action> tag
    import pyarrow.parquet as pq

    assert pq.read_table(path).to_pylist() == [
        {"episode": 0, "step": 0, "alternative": 0, "writer": "openai:judge", "rationale": "It is closer."},
        {"episode": 0, "step": 1, "alternative": 0, "writer": "openai:judge", "rationale": "The mug is there."},
    ]
    rows = pq.read_table(folder / "rollout.parquet").to_pylist()
    assert rationales_for(folder, "openai:judge", rows) == {(0, 0, 0): "It is closer.", (0, 1, 0): "The mug is there."}
    # another writer's file: the contrast writer runs in memory; a model writer is refused
    assert rationales_for(folder, "contrast", rows)[(0, 0, 0)].startswith('Doing "go to cabinet 1" leads to:')
    trainer = _trainer(tiny_checkpoint, template="think-action")
    trainer.policy.env_name = "alfworld"
    sr = SR(SRConfig(data=str(folder), writer="openai:judge"))
    sr.prepare(trainer)
    assert len(sr.reflections) == 2
    config = _config("sr", "alfworld", f"algorithm.data={folder}", "algorithm.writer=hf:/models/judge")
    with pytest.raises(ConfigError, match=r"has no rationales written by hf:/models/judge; write them first with "):
        algorithm_class("sr")(config.algorithm).check(config)


def test_the_rationales_command_and_an_hf_writer(tiny_checkpoint: Path, tmp_path: Path, capsys) -> None:
    import argparse

    import pyarrow.parquet as pq

    from envrl.agents.generation import SamplingConfig
    from envrl.agents.hf import HFBackend
    from envrl.training import rationales

    folder = make_folder("scienceworld", tmp_path / "data")
    parser = argparse.ArgumentParser()
    rationales.add_arguments(parser)
    assert rationales.run(parser.parse_args(["--data", str(folder), "--no-progress"])) == 0
    assert "wrote 4 rationales by contrast" in capsys.readouterr().out
    saved = pq.read_table(folder / "rationales.parquet").to_pylist()
    rows = pq.read_table(folder / "rollout.parquet").to_pylist()
    assert [r["rationale"] for r in saved] == ContrastWriter(load_rationale_template()).write(rows)
    # hf: a local model, greedy, through the agents' back end; its replies are the rationales (cleaned)
    spec = f"hf:{tiny_checkpoint}"
    path = write_rationales(folder, rationales.make_writer(spec, max_new_tokens=6, device="cpu"), out_name="hf.parquet")
    template = load_rationale_template()
    backend = HFBackend(str(tiny_checkpoint), device="cpu")
    replies = backend.generate([template.messages(r) for r in rows], SamplingConfig(temperature=0.0, max_new_tokens=6))
    expected = [rationales.clean_rationale(g.text) for g in replies]
    assert [r["rationale"] for r in pq.read_table(path).to_pylist()] == [e for e in expected if e is not None]
    assert {r["writer"] for r in pq.read_table(path).to_pylist()} <= {spec}
    with pytest.raises(rationales.RationaleError, match="unknown rationale writer 'gpt4'"):
        rationales.make_writer("gpt4")


# ---- configuration -----------------------------------------------------------------------------


def _config(algo: str, env: str, *sets: str):
    return build_config(algo, env, algorithm_config=algorithm_class(algo).Config, sets=list(sets))


def test_config_errors_are_one_sentence(folders) -> None:
    with pytest.raises(ConfigError, match=r"^iwm needs an early-experience folder: build one with `envrl data early"):
        config = _config("iwm", "textworld")
        IWM(config.algorithm).check(config)
    config = _config("sr", "textworld", "algorithm.data=/nowhere")
    with pytest.raises(ConfigError, match=r"^/nowhere is not an early-experience folder \(it lacks expert.parquet"):
        SR(config.algorithm).check(config)
    data = f"algorithm.data={folders('textworld')}"
    config = _config("sr", "textworld", data, "policy.template=action")
    with pytest.raises(ConfigError, match=r"template 'action' has no thought in its response: pick one with require"):
        SR(config.algorithm).check(config)
    assert _config("sr", "textworld", data).policy.template == "think-action"  # the shipped YAML's
    SR(_config("sr", "textworld", data).algorithm).check(_config("sr", "textworld", data))
    config = _config("iwm", "textworld", data, "algorithm.template=inverse-dynamics")
    with pytest.raises(ConfigError, match="must be a state-prediction template"):
        IWM(config.algorithm).check(config)
    config = _config("iwm", "textworld", data, "algorithm.schedule=interleaved")
    with pytest.raises(ConfigError, match="schedule must be two_stage or mixed"):
        IWM(config.algorithm).check(config)


def test_data_of_another_env_is_refused(tiny_checkpoint: Path, folders) -> None:
    with pytest.raises(ConfigError, match=r"holds webshop data, not textworld: train with --env webshop"):
        IWM(IWMConfig(data=str(folders("webshop")))).prepare(_trainer(tiny_checkpoint))


def test_the_folder_reader_lives_beside_the_builder_not_in_the_algorithms() -> None:
    """#29.5: algorithms/iwm.py and sr.py hold the algorithms; reading the folder is early_experience_data's."""
    from envrl.training import early_experience_data as data
    from envrl.training.algorithms import iwm, sr

    moved = ("EarlyExperience", "check_folder", "read_early_experience", "check_env", "expert_histories")
    assert all(getattr(data, name).__module__ == data.__name__ for name in (*moved, "policy_messages"))
    for module in (iwm, sr):
        source = inspect.getsource(module)
        assert not any(f"def {name}(" in source or f"class {name}" in source for name in moved)
        assert "read_table" not in source and not hasattr(module, "BUILD_COMMAND")
    assert "--model POLICY_DIR" in data.BUILD_COMMAND  # the folder's alternatives come from the policy


# ---- one tiny iteration per env ---------------------------------------------------------------


# every pair costs a run (~2 s): the default suite keeps one per algorithm, SR on WebShop's long pages
TINY_RUNS = [
    pytest.param(
        algo, env, marks=[] if (algo, env) in (("iwm", "textworld"), ("sr", "webshop")) else [pytest.mark.slow]
    )
    for algo in ("iwm", "sr")
    for env in ("textworld", "alfworld", "webshop", "scienceworld")
]


@pytest.mark.parametrize("algo, env", TINY_RUNS)
def test_one_tiny_iteration(algo: str, env: str, tiny_checkpoint: Path, tmp_path: Path, folders) -> None:
    sets = [
        f"policy.model={tiny_checkpoint}",
        f"out={tmp_path / 'out'}",
        f"algorithm.data={folders(env)}",
        "updates=2" if algo == "iwm" else "updates=1",
        "policy.history=1",
        "policy.device=cpu",
        "eval.episodes=0",
        "optim.lr=1e-3",
        "algorithm.batch_size=2",
    ]
    train(_config(algo, env, *sets), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    if algo == "iwm":  # the shipped two_stage schedule: one world-model update, then one imitation update
        assert [(r["update"], r["stage"]) for r in rows] == [(1, 1), (2, 2)]
        assert rows[0]["loss/world_model"] > 0 and "loss/sft" not in rows[0]
        assert rows[1]["loss/sft"] > 0 and "loss/world_model" not in rows[1]
    else:
        assert [r["update"] for r in rows] == [1]
        assert rows[0]["loss/reflection"] > 0 and rows[0]["loss/sft"] > 0
    for row in rows:  # weights 1: the loss is the sum of its terms
        parts = [row.get(key, 0.0) for key in ("loss/sft", "loss/world_model", "loss/reflection")]
        assert row["loss"] == pytest.approx(sum(parts), rel=1e-5)
    model = tmp_path / "out" / "checkpoints" / f"update-{len(rows):06d}" / "model"
    assert (model / "config.json").is_file()


@pytest.mark.slow
def test_the_whole_pipeline_on_textworld(tiny_checkpoint: Path, tmp_path: Path, tw_cache) -> None:
    """`envrl data expert` -> `envrl data early-experience` -> IWM and SR, on a real env's rows."""
    import pyarrow.parquet as pq

    kwargs = {"cache_dir": str(tw_cache), "families": ["custom"]}
    expert = collect_expert_data(
        "textworld", "train", 1, tmp_path / "expert", agent="expert", template="action", history=1, env_kwargs=kwargs
    )
    folder = build_early_experience("textworld", "train", expert, tmp_path / "early", k=2, model=tiny_checkpoint)
    rollout = pq.read_table(folder / "rollout.parquet").to_pylist()
    assert rollout
    trainer = _trainer(tiny_checkpoint)  # the template and history the data was built with
    iwm = IWM(IWMConfig(data=str(folder)))
    iwm.prepare(trainer)
    # rebuilt prompts are the stored ones, byte for byte: the expert's and those at each rollout state
    assert [d.prompt_ids for d in iwm.demonstrations] == [
        trainer.policy.encode_prompt(m) for m in _stored_messages(folder)
    ]
    for row in rollout:
        assert policy_messages(trainer.policy, row, row["history"]) == row["messages"]
    for algo in ("iwm", "sr"):
        sets = [
            f"policy.model={tiny_checkpoint}",
            f"out={tmp_path / algo}",
            f"algorithm.data={folder}",
            "updates=2",
            "policy.history=1",
            "policy.device=cpu",
            "eval.episodes=0",
            "algorithm.batch_size=2",
        ]
        train(_config(algo, "textworld", *sets), progress=False)
        rows = [json.loads(line) for line in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
        assert [r["update"] for r in rows] == [1, 2]
