"""envrl's envs in TRL's GRPOTrainer (envrl.integrations.trl), tested against the installed TRL.

The fast tests play the adapter the way TRL does (reset with a dataset row, tools found the way
TRL finds them) and check it against the envrl env itself: the first observation of a row's task
and seed, the env's return for the same actions, the end of an episode. The slow tests run the
real ``GRPOTrainer`` for a step on CPU with a from-scratch tiny model and check that the reward
TRL used for every rollout is the return of the same actions replayed in a fresh envrl env.
"""

from __future__ import annotations

import inspect
import pickle
import sys
from pathlib import Path

import gymnasium as gym
import pytest

pytest.importorskip("trl")
trl_adapter = pytest.importorskip("envrl.integrations.trl")

import envrl  # noqa: E402,F401  (registers the ids)

TW_KWARGS = {"families": ["custom"]}
TW_SPLIT = "valid"


@pytest.fixture(scope="module")
def tw_kwargs(tw_custom_kwargs) -> dict:
    """TextWorld kwargs: the custom quests, their first valid game already made (conftest)."""
    return {**TW_KWARGS, **tw_custom_kwargs}


def _tools(cls) -> set[str]:
    """The tools TRL makes of an environment class (its rule in GRPOTrainer.__init__)."""
    return {
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    }


def _replay(env_name: str, row: dict, actions, **kwargs) -> float:
    """The return of ``actions`` played in a fresh envrl env from ``row``'s task and seed."""
    env = gym.make(envrl.envs.env_id(env_name), split=row["split"], **kwargs)
    try:
        env.reset(seed=row["seed"], options={"task_id": row["task_id"]})
        total = 0.0
        for action in actions:
            _, reward, terminated, truncated, _ = env.step(action)
            total += reward
            if terminated or truncated:
                break
        return total
    finally:
        env.close()


# ---- the TRL contract -------------------------------------------------------------------------------


def test_the_tools_are_the_envs_own_verbs_with_schemas():
    from transformers.utils import get_json_schema

    assert _tools(trl_adapter.TextWorldEnvironment) == {"act"}
    assert _tools(trl_adapter.ALFWorldEnvironment) == {"act"}
    assert _tools(trl_adapter.ScienceWorldEnvironment) == {"act"}
    assert _tools(trl_adapter.WebShopEnvironment) == {"search", "click"}
    webshop = trl_adapter.WebShopEnvironment()  # cheap: nothing starts before reset
    schema = get_json_schema(webshop.search)["function"]
    assert schema["name"] == "search"
    assert schema["parameters"]["properties"]["query"]["type"] == "string"
    assert schema["parameters"]["required"] == ["query"]
    act = get_json_schema(trl_adapter.TextWorldEnvironment().act)["function"]
    assert act["parameters"]["properties"]["action"]["description"].startswith("One command")


def test_the_factory_binds_kwargs_and_pickles(tw_kwargs):
    factory = trl_adapter.environment_factory("envrl/TextWorld-v0", max_episode_steps=2, **tw_kwargs)
    environment = pickle.loads(pickle.dumps(factory))()
    assert type(environment) is trl_adapter.TextWorldEnvironment
    with pytest.raises(ValueError, match="unknown environment"):
        trl_adapter.environment_factory("minecraft")
    row = trl_adapter.split_rows("textworld", TW_SPLIT, 1, env_kwargs=tw_kwargs)[0]
    environment.reset(**row)
    environment.act("look")
    assert "the step limit" in environment.act("look")  # max_episode_steps=2 reached the env
    assert environment.done and environment.actions == ("look", "look")


def test_rows_are_deterministic_and_carry_task_and_seed(tw_kwargs):
    rows = trl_adapter.split_rows("textworld", TW_SPLIT, 40, seed=7, env_kwargs=tw_kwargs)
    assert rows == trl_adapter.split_rows("textworld", TW_SPLIT, 40, seed=7, env_kwargs=tw_kwargs)
    env = gym.make("envrl/TextWorld-v0", split=TW_SPLIT, **tw_kwargs)
    task_ids = list(env.unwrapped.task_ids)
    env.close()
    assert len(task_ids) == 34  # the custom family of valid: the run wraps around
    assert [r["task_id"] for r in rows] == [task_ids[i % 34] for i in range(40)]
    assert [r["seed"] for r in rows] == list(range(7, 47))
    assert {r["environment"] for r in rows} == {"textworld"} and {r["split"] for r in rows} == {TW_SPLIT}
    dataset = trl_adapter.split_dataset("webshop", "test", seed=3)
    assert set(dataset.column_names) == {"prompt", "task_id", "seed", "split", "environment"}
    assert dataset[0]["prompt"][0]["role"] == "user" and dataset[0]["seed"] == 3
    assert len(dataset) == len(gym.make("envrl/WebShop-v0", split="test").unwrapped.task_ids)
    with pytest.raises(ValueError, match="episodes must be >= 1"):
        trl_adapter.split_rows("webshop", "test", 0)


def test_reset_gives_the_envs_first_observation_for_the_rows_task(tw_kwargs):
    rows = trl_adapter.split_rows("textworld", TW_SPLIT, 35, env_kwargs=tw_kwargs)[::34]  # one game, two seeds
    assert rows[0]["task_id"] == rows[1]["task_id"] and rows[0]["seed"] != rows[1]["seed"]
    environment = trl_adapter.environment_factory("textworld", **tw_kwargs)()
    env = gym.make("envrl/TextWorld-v0", split=TW_SPLIT, **tw_kwargs)
    for row in rows:
        text = environment.reset(**row)
        observation, info = env.reset(seed=row["seed"], options={"task_id": row["task_id"]})
        assert text.startswith(observation)  # the row's prompt already holds the intro
        assert environment.info["task_id"] == row["task_id"]
        for action in info["admissible_actions"]:
            assert f"\n- {action}\n" in text + "\n"
        assert environment.reset(**row) == text  # every completion of a group starts here
    env.close()
    placeholder = environment.reset(
        prompt=[{"role": "user", "content": ""}], task_id=rows[0]["task_id"], split=TW_SPLIT
    )
    assert placeholder.startswith(trl_adapter.TextWorldEnvironment.intro)  # TRL's rows without a dataset
    with pytest.raises(ValueError, match="reached the textworld environment"):
        environment.reset(**{**rows[0], "environment": "webshop"})


def test_walkthrough_via_act_wins_and_get_reward_is_the_envs_return(tw_kwargs):
    row = trl_adapter.split_rows("textworld", TW_SPLIT, 1, env_kwargs=tw_kwargs)[0]
    environment = trl_adapter.environment_factory("textworld", **tw_kwargs)()
    assert environment.act("look") == trl_adapter.NOT_STARTED_MESSAGE
    environment.reset(**row)
    env = gym.make("envrl/TextWorld-v0", split=TW_SPLIT, expert_plan=True, **tw_kwargs)
    _, info = env.reset(seed=row["seed"], options={"task_id": row["task_id"]})
    env.close()
    walkthrough = info["expert_plan"]
    answers = [environment.act(action) for action in ["go nowhere", "take the moon", *walkthrough]]
    assert "episode is over (won)" in answers[-1]
    assert environment.get_reward() == pytest.approx(1.0)
    assert environment.get_reward() == pytest.approx(_replay("textworld", row, environment.actions, **tw_kwargs))
    after = environment.act(walkthrough[0])
    assert after.startswith(trl_adapter.EPISODE_OVER_MESSAGE) and "return 1" in after
    assert environment.get_reward() == pytest.approx(1.0) and len(environment.actions) == len(walkthrough) + 2
    environment.reset(**row)  # a new rollout starts from zero
    assert environment.get_reward() == 0.0 and not environment.done and environment.actions == ()


def test_webshop_oracle_via_search_and_click_earns_the_envs_reward():
    row = trl_adapter.split_rows("webshop", "test", 3)[2]
    environment = trl_adapter.WebShopEnvironment()
    environment.reset(**row)
    env = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    _, info = env.reset(seed=row["seed"], options={"task_id": row["task_id"]})
    env.close()
    assert "click[x]" not in environment.click("x")  # feedback, and the episode goes on
    for action in info["expert_plan"]:
        verb, argument = action[:-1].split("[", 1)
        answer = getattr(environment, verb)(argument)
    assert "episode is over" in answer
    assert environment.get_reward() > 0.5
    assert environment.get_reward() == pytest.approx(_replay("webshop", row, environment.actions))
    assert environment.search("more shoes").startswith(trl_adapter.EPISODE_OVER_MESSAGE)


def test_garbage_tool_arguments_become_feedback(tw_kwargs):
    """What a random model sends: wrong types, chained commands, huge text; each is env feedback."""
    row = trl_adapter.split_rows("textworld", TW_SPLIT, 1, env_kwargs=tw_kwargs)[0]
    environment = trl_adapter.environment_factory("textworld", **tw_kwargs)()
    environment.reset(**row)
    for garbage in (123, None, ["go", "south"], "go south, take key", "x" * 5000, "", "quit"):
        assert isinstance(environment.act(garbage), str)
    assert environment.get_reward() == 0.0 and not environment.done
    webshop = trl_adapter.WebShopEnvironment()
    webshop.reset(**trl_adapter.split_rows("webshop", "test", 1)[0])
    assert "not clickable" in webshop.click({"a": 1})
    assert webshop.search("]" * 3000).startswith("Invalid action")


# ---- the real trainer ---------------------------------------------------------------------------------


def _tool_checkpoint(path: Path) -> Path:
    """The tests' tiny from-scratch model, with TRL's Qwen2.5 chat template (the tiny ChatML one
    cannot render tool calls, and TRL refuses such templates) and room for multi-turn prompts."""
    import json

    from tiny_lm import build_tiny_checkpoint
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    build_tiny_checkpoint(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.eos_token = "<|im_end|>"  # the end of a turn, as in Qwen2.5-Instruct (TRL cuts turns there)
    tokenizer.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 8192  # rotary positions: only the bound TRL reads changes
    (path / "config.json").write_text(json.dumps(config))
    return path


class _RewardSpy:
    """A reward function of weight 0 that records each rollout's environment state when TRL scores it."""

    __name__ = "spy"

    def __init__(self) -> None:
        self.rollouts: list[dict] = []

    def __call__(self, prompts, completions, environments=None, **columns):
        for i, environment in enumerate(environments):
            self.rollouts.append(
                {
                    "row": {k: columns[k][i] for k in ("task_id", "seed", "split")},
                    "env": environment.env_name,
                    "actions": environment.actions,
                    "reward": environment.get_reward(),
                }
            )
        return [0.0] * len(completions)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """TRL's trainer sets accelerate's process-wide state (bf16 on CPU); later tests in this process
    start from none, as a new process would (accelerate's own tests reset it the same way)."""
    yield
    if "accelerate" in sys.modules:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)


def _train(tmp_path: Path, checkpoint: Path, factory, dataset, logged: list, **config):
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Logs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logged.append(dict(logs or {}))

    spy = _RewardSpy()
    settings = {
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 96,
        "max_tool_calling_iterations": 4,
        "max_steps": 1,
        "logging_steps": 1,
        "learning_rate": 1e-4,
        "report_to": "none",
        "use_cpu": True,
        "save_strategy": "no",
        "seed": 0,
        "temperature": 1.0,
        "reward_weights": [0.0],  # the spy only records; the env's get_reward is the reward
        **config,
    }
    args = GRPOConfig(output_dir=str(tmp_path / "out"), **settings)
    trainer = GRPOTrainer(
        model=str(checkpoint),
        reward_funcs=[spy],
        args=args,
        train_dataset=dataset,
        environment_factory=factory,
        callbacks=[Logs()],
    )
    trainer.train()
    return spy, trainer


def _check_rewards(spy: _RewardSpy, logged: list, kwargs_by_env: dict) -> None:
    assert spy.rollouts, "TRL scored no rollout"
    for rollout in spy.rollouts:
        replayed = _replay(rollout["env"], rollout["row"], rollout["actions"], **kwargs_by_env[rollout["env"]])
        assert rollout["reward"] == pytest.approx(replayed)
    means = {
        k: float(v) for entry in logged for k, v in entry.items() if k.startswith("rewards/") and k.endswith("/mean")
    }
    for env_name in kwargs_by_env:
        class_name = trl_adapter.ENVIRONMENTS[env_name].__name__
        own = [r["reward"] for r in spy.rollouts if r["env"] == env_name]
        assert means[f"rewards/{class_name}/mean"] == pytest.approx(sum(own) / len(own), abs=1e-6)


@pytest.mark.slow
def test_grpo_trainer_on_textworld_and_webshop_uses_the_envs_rewards(tmp_path, tw_kwargs, monkeypatch):
    """One GRPO step on a mixed TextWorld + WebShop dataset: every rollout's reward is its env's return."""
    pytest.importorskip("torch")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import concatenate_datasets

    checkpoint = _tool_checkpoint(tmp_path / "model")
    factories = {
        "textworld": trl_adapter.environment_factory("textworld", max_episode_steps=5, **tw_kwargs),
        "webshop": trl_adapter.environment_factory("webshop", admissible_limit=10),
    }
    dataset = concatenate_datasets(
        [
            trl_adapter.split_dataset("textworld", TW_SPLIT, 1, env_kwargs=tw_kwargs),
            trl_adapter.split_dataset("webshop", "test", 1),
        ]
    )
    logged: list = []
    spy, _ = _train(tmp_path, checkpoint, factories, dataset, logged, gradient_accumulation_steps=2)
    assert {r["env"] for r in spy.rollouts} == {"textworld", "webshop"}
    _check_rewards(spy, logged, {"textworld": tw_kwargs, "webshop": {}})
    by_group = {}
    for rollout in spy.rollouts:
        by_group.setdefault((rollout["row"]["task_id"], rollout["row"]["seed"]), []).append(rollout)
    assert all(len(group) == 4 for group in by_group.values())  # each group: one task, one seed


@pytest.mark.slow
def test_grpo_trainer_steps_textworld_through_tool_calls(tmp_path, tw_kwargs, monkeypatch):
    """A model taught to call ``act`` with the walkthrough's commands: TRL steps the env through the
    adapter, and each rollout's reward is the return of its actions replayed in a fresh env."""
    pytest.importorskip("torch")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")

    checkpoint = _tool_checkpoint(tmp_path / "model")
    dataset = trl_adapter.split_dataset("textworld", TW_SPLIT, 1, env_kwargs=tw_kwargs)
    row = dataset[0]
    env = gym.make("envrl/TextWorld-v0", split=TW_SPLIT, expert_plan=True, **tw_kwargs)
    _, info = env.reset(seed=row["seed"], options={"task_id": row["task_id"]})
    env.close()
    # no admissible lists: shorter conversations, so the tiny model learns its calls in seconds
    factory = trl_adapter.environment_factory("textworld", max_episode_steps=8, admissible_limit=0, **tw_kwargs)
    teach_walkthrough(checkpoint, factory(), row, info["expert_plan"], steps=100)
    logged: list = []
    spy, _ = _train(
        tmp_path,
        checkpoint,
        factory,
        dataset,
        logged,
        max_completion_length=1536,
        max_tool_calling_iterations=8,
        temperature=0.3,
    )
    _check_rewards(spy, logged, {"textworld": tw_kwargs})
    assert sum(len(r["actions"]) for r in spy.rollouts) >= 4, "the taught model made no tool calls"
    # sampled at temperature 0.3 from a model that learned the walkthrough, rollouts win through TRL's tool loop
    assert max(r["reward"] for r in spy.rollouts) == pytest.approx(1.0)


def teach_walkthrough(checkpoint: Path, environment, row: dict, commands, steps: int = 80, lr: float = 5e-3) -> None:
    """A few seconds of SFT on the winning conversation (prompt, tool calls of ``commands``, the env's
    answers) so that the tiny model plays it back when sampled; loss on the assistant turns only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    first = row["prompt"][0]["content"] + environment.reset(**row)
    conversation = [{"role": "user", "content": first}]
    for command in commands:
        call = {"type": "function", "function": {"name": "act", "arguments": {"action": command}}}
        conversation.append({"role": "assistant", "content": "", "tool_calls": [call]})
        conversation.append({"role": "tool", "name": "act", "content": environment.act(command)})
    assert environment.get_reward() == pytest.approx(1.0)

    def render(messages, generation_prompt):
        return tokenizer.apply_chat_template(
            messages, tools=[environment.act], add_generation_prompt=generation_prompt, tokenize=False
        )

    ids: list[int] = []
    labels: list[int] = []
    done = ""
    for k, message in enumerate(conversation):
        if message["role"] != "assistant":
            continue
        before, after = render(conversation[:k], True), render(conversation[: k + 1], False)
        for text, learn in ((before[len(done) :], False), (after[len(before) :], True)):
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            labels += piece if learn else [-100] * len(piece)
        done = after
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(0)
    batch = {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels])}
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(checkpoint)
