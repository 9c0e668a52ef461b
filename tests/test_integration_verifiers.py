"""envrl in verifiers (``envrl.integrations.verifiers``), run by verifiers' own machinery.

Rollouts here go through verifiers' episode runner (``Env.run_slot``, the interception proxy,
the task's rubric), and the model is reached over HTTP on 127.0.0.1: an ``envrl serve-model``
app whose back end is scripted (TextWorld's walkthrough, or bad replies) in the default tests,
the real ``envrl serve-model`` command serving the from-scratch tiny checkpoint behind the real
``vf-eval`` runner in the slow one. The checks: the rubric's reward is the envrl env's return for
the same task, seed and actions, and the messages on the wire are the env's observations.

TextWorld games come from envrl's cache (made on first use), only the ``custom`` family of
``valid`` (small games, a few seconds each).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import pytest

pytest.importorskip("verifiers", reason="needs the verifiers extra: pip install 'envrl[verifiers]'")
pytest.importorskip("flask")
pytest.importorskip("openai")

import verifiers.v1 as vf  # noqa: E402
from verifiers.v1.utils.loaders import default_harness_id, environment_class, taskset_class  # noqa: E402

import envrl.envs  # noqa: E402, F401  (registers the envrl ids)
from envrl.agents.generation import Generation  # noqa: E402
from envrl.agents.prompts import Conversation, load_template, parse_response  # noqa: E402
from envrl.agents.serve_model import create_app, get_batcher  # noqa: E402
from envrl.integrations import verifiers as adapter  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TW_ID = "envrl/TextWorld-v0"
GREEDY = {"temperature": 0, "max_tokens": 24}


#: jericho warns that generated games lack its per-game tables; TextWorld tracks the state itself
pytestmark = pytest.mark.filterwarnings("ignore:.*is not fully supported")


@pytest.fixture(scope="module")
def tw_kwargs(tw_custom_kwargs) -> dict:
    """TextWorld's small ``custom`` games, with the one game the default tests play
    (``tw-custom:valid:0``) already made in envrl's cache (conftest)."""
    return dict(tw_custom_kwargs)


def _direct_env(tw_kwargs: dict, max_turns: int | None = None) -> gym.Env:
    extra = {} if max_turns is None else {"max_episode_steps": max_turns}
    return gym.make(TW_ID, split="valid", **tw_kwargs, **extra)


def _walkthrough(tw_kwargs: dict, task_id: str) -> list[str]:
    env = gym.make(TW_ID, split="valid", expert_plan=True, **tw_kwargs)
    try:
        return list(env.reset(options={"task_id": task_id})[1]["expert_plan"])
    finally:
        env.close()


def _replay(tw_kwargs: dict, task_id: str, seed: int, actions: list[str], max_turns: int | None = None):
    """Play ``actions`` in a plain envrl env: the observations, the return and the last info."""
    env = _direct_env(tw_kwargs, max_turns)
    try:
        observation, info = env.reset(seed=seed, options={"task_id": task_id})
        observations, total = [observation], 0.0
        for action in actions:
            observation, reward, terminated, truncated, info = env.step(action)
            observations.append(observation)
            total += reward
            if terminated or truncated:
                break
        return observations, total, info
    finally:
        env.close()


class ScriptedBackend:
    """A served "model" that answers from a script: ``script(first_user_message, turn) -> text``.

    It sees exactly what verifiers sent (the conversation), so the tests also read the wire here.
    """

    model = "scripted"
    max_batch_size = 8

    def __init__(self, script):
        self.script = script
        self.requests: list[list[dict]] = []

    def generate(self, prompts, sampling):
        self.requests.extend(prompts)
        out = []
        for messages in prompts:
            first = next(m["content"] for m in messages if m["role"] == "user")
            turn = sum(m["role"] == "assistant" for m in messages)
            out.append(Generation(text=self.script(first, turn), prompt_tokens=1, completion_tokens=1))
        return out

    def protocol(self):
        return {"backend": "scripted"}

    def close(self):
        pass


def _serve(backend, name: str):
    """``backend`` behind envrl's OpenAI-compatible app on 127.0.0.1 (a free port); returns
    the base URL and a stop function."""
    from werkzeug.serving import make_server

    app = create_app(backend, model_name=name, max_new_tokens_limit=64)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        thread.join(5)
        get_batcher(app).close()

    return f"http://127.0.0.1:{server.server_port}/v1", stop


def _evaluate(environment, backend, name="scripted", rollouts=1):
    base, stop = _serve(backend, name)
    try:
        return asyncio.run(adapter.evaluate(environment, model=name, base_url=base, sampling=GREEDY, rollouts=rollouts))
    finally:
        stop()


def _trace_texts(trace, role: str) -> list[str]:
    return [node.message.content for node in trace.nodes if node.message.role == role]


# ---- the dataset and bad arguments ------------------------------------------------------------------


def test_rows_follow_the_envrl_eval_rule(tw_kwargs):
    """Episode i plays task_ids[i mod n] with seed seed + i, like ``envrl eval``."""
    env = _direct_env(tw_kwargs)
    task_ids = list(env.unwrapped.task_ids)
    env.close()
    n = len(task_ids)
    rows = adapter.dataset_rows("textworld", "valid", n + 2, seed=7, env_kwargs=tw_kwargs)
    assert [(r["episode"], r["task_id"], r["seed"]) for r in rows] == [
        (i, task_ids[i % n], 7 + i) for i in range(n + 2)
    ]
    assert {r["split"] for r in rows} == {"valid"}
    assert [r["task_id"] for r in adapter.dataset_rows("textworld", "valid", env_kwargs=tw_kwargs)] == task_ids


def test_load_environment_builds_verifiers_own_classes(tw_kwargs):
    environment = adapter.load_environment("envrl/TextWorld-v0", "valid", 3, max_turns=4, seed=5, **tw_kwargs)
    assert isinstance(environment, vf.Env) and isinstance(environment, adapter.EnvrlEnv)
    tasks = list(environment.taskset)
    assert [type(t) for t in tasks] == [adapter.EnvrlTask] * 3
    assert [(t.data.idx, t.data.seed, t.data.env, t.data.max_turns) for t in tasks] == [
        (i, 5 + i, "textworld", 4) for i in range(3)
    ]
    assert len({t.key for t in tasks}) == 3 and tasks[0].data.prompt is None
    assert tasks[0].data.system_prompt == load_template("think-action").system
    # verifiers resolves the taskset id to this module's classes, as vf-eval will
    assert taskset_class(adapter.TASKSET_ID) is adapter.EnvrlTaskset
    assert environment_class(adapter.TASKSET_ID) is adapter.EnvrlEnv
    assert default_harness_id(adapter.TASKSET_ID) == adapter.TASKSET_ID
    assert environment.config.agent_harnesses()["player"].id == adapter.TASKSET_ID
    assert environment.config.player.runtime.type == "subprocess"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"episodes": 0}, "episodes must be a positive integer"),
        ({"episodes": True}, "episodes must be a positive integer"),
        ({"episodes": 2.5}, "episodes must be a positive integer"),
        ({"seed": -1}, "seed must be an integer"),
        ({"max_turns": 0}, "max_turns must be a positive integer"),
        ({"split": "nope"}, "unknown TextWorld split"),
        ({"env": "minecraft"}, "unknown environment"),
        ({"template": "no-such-template"}, "unknown prompt template"),
        ({"families": ["nope"]}, "families must be"),
    ],
)
def test_bad_arguments_fail_in_load_environment(kwargs, message, tw_kwargs):
    args = {"env": "textworld", "split": "valid", **tw_kwargs, **kwargs}
    with pytest.raises((ValueError, TypeError), match=message):
        adapter.load_environment(**args)


# ---- one episode: bad replies and the end -----------------------------------------------------------


def test_bad_replies_get_the_envs_own_feedback_and_never_raise(tw_kwargs):
    session = adapter.EpisodeSession("textworld", "tw-custom:valid:0", 3, split="valid", env_kwargs=tw_kwargs)
    first_obs, _, _ = _replay(tw_kwargs, "tw-custom:valid:0", 3, [])
    template = load_template("think-action")
    expected_first = Conversation(template, "textworld", 0).messages(first_obs[0], session.info)[-1]["content"]
    assert session.first_message == expected_first
    bad = [
        "",
        "go north",  # no tags
        "<think>x</think><action></action>",
        "<think>x</think><action>go north</action><action>go south</action>",
        None,
        12,
        "<action>" + "a" * 100_000,
        "<think>ok</think><action>dance; quit</action>",  # well formed, refused by the env
    ]
    sent = []
    try:
        for reply in bad:
            outcome = session.respond(reply)
            sent.append(outcome.action)
            assert not outcome.done and outcome.reward == 0 and outcome.valid_action is False
        assert sent == [""] * 7 + ["dance; quit"]
        # the same actions in a plain env: the feedback the model read is the env's own
        observations, total, info = _replay(tw_kwargs, "tw-custom:valid:0", 3, sent)
        assert observations[1] == "Nothing happens." and observations[-1] in outcome.message
        summary = session.summary()
        assert (summary["return"], summary["success"]) == (total, info["success"])
        assert (summary["turns"], summary["invalid_actions"], summary["format_errors"]) == (8, 8, 7)
    finally:
        session.close()


def test_after_the_end_nothing_reaches_the_env(tw_kwargs):
    plan = _walkthrough(tw_kwargs, "tw-custom:valid:0")
    session = adapter.EpisodeSession("textworld", "tw-custom:valid:0", 0, split="valid", env_kwargs=tw_kwargs)
    try:
        for action in plan:
            outcome = session.respond(f"<think>t</think><action>{action}</action>")
        assert outcome.done and session.terminated and session.summary()["success"] is True
        steps = session.env.unwrapped._steps
        after = session.respond("<think>t</think><action>look</action>")
        assert after == adapter.StepOutcome(after.message, 0.0, True, None, False, None)
        assert after.message.startswith(adapter.EPISODE_OVER_MESSAGE) and "succeeded" in after.message
        assert session.env.unwrapped._steps == steps and session.summary()["turns"] == len(plan)
    finally:
        session.close()
    with pytest.raises(gym.error.ClosedEnvironmentError):
        session.env.unwrapped.reset()


# ---- verifiers' runner against a served model ----------------------------------------------------


def test_engines_that_are_not_thread_safe_share_one_thread():
    """TextWorld's game loading breaks when two threads load at once (the vf-eval test below
    failed that way with two rollouts), so its rollouts share one thread; WebShop's do not."""
    shared = adapter.engine_thread("textworld")
    assert adapter.engine_thread("envrl/TextWorld-v0") is shared is adapter.engine_thread("alfworld")
    own, other = adapter.engine_thread("webshop"), adapter.engine_thread("webshop")
    assert own is not other and shared not in (own, other)
    own.shutdown(), other.shutdown()


def test_the_walkthrough_through_verifiers_scores_the_envs_return(tw_kwargs):
    """A served scripted model plays TextWorld's walkthrough (after one malformed reply and one
    action the game refuses) through verifiers' runner, two rollouts of one row; the rubric
    equals the envrl env's return and success for the same task, seed and actions, the user
    messages are the env's observations, and the model is not asked again once the game is won."""
    environment = adapter.load_environment("textworld", "valid", 1, max_turns=12, seed=40, **tw_kwargs)
    (row,) = environment.taskset.rows()
    assert (row["task_id"], row["seed"]) == ("tw-custom:valid:0", 40)
    script = ["I am not sure.", "dance"] + _walkthrough(tw_kwargs, row["task_id"])

    def reply(first, turn):
        return f"<think>turn {turn}</think><action>{script[turn]}</action>" if turn else script[0]

    backend = ScriptedBackend(reply)
    episodes = _evaluate(environment, backend, rollouts=2)
    assert len(episodes) == 2 and all(e.ok and not e.errors for e in episodes)
    assert len(backend.requests) == 2 * len(script)  # nothing after the win
    traces = [episode.traces[0] for episode in episodes]
    for trace in traces:
        assert (trace.task.data.task_id, trace.task.data.seed) == ("tw-custom:valid:0", 40)
        actions = [parse_response(text).action or "" for text in _trace_texts(trace, "assistant")]
        assert actions == [""] + script[1:]
        observations, total, info = _replay(tw_kwargs, "tw-custom:valid:0", 40, actions)
        assert info["success"] and total == pytest.approx(1.0)
        assert trace.reward == trace.rewards["episode_return"].score == pytest.approx(total)
        assert trace.metrics["success"] == 1.0 and trace.metrics["final_score"] == pytest.approx(info["score"])
        assert trace.metrics["invalid_actions"] == 2 and trace.metrics["format_errors"] == 1
        assert trace.metrics["turns"] == len(actions) and trace.stop_condition == "envrl_terminated"
        users = _trace_texts(trace, "user")
        assert len(users) == len(observations) - 1  # the final observation ends the episode, unsent
        assert all(obs in message for obs, message in zip(observations, users))
    # a row is deterministic: both rollouts saw the same messages
    assert _trace_texts(traces[0], "user") == _trace_texts(traces[1], "user")


def test_a_model_that_never_acts_is_truncated_with_zero_reward(tw_kwargs):
    environment = adapter.load_environment("textworld", "valid", 1, max_turns=3, **tw_kwargs)
    backend = ScriptedBackend(lambda first, turn: "Hmm. <action>")
    (episode,) = _evaluate(environment, backend)
    (trace,) = episode.traces
    assert episode.ok and trace.reward == 0.0 and trace.stop_condition == "envrl_truncated"
    counts = {name: trace.metrics[name] for name in ("success", "turns", "invalid_actions", "format_errors")}
    assert counts == {"success": 0.0, "turns": 3.0, "invalid_actions": 3.0, "format_errors": 3.0}
    assert len(backend.requests) == 3
    assert trace.info["envrl"]["truncated"] is True and trace.info["envrl"]["terminated"] is False


def test_an_unreachable_model_fails_the_episode_not_the_run(tw_kwargs):
    """Nothing listens on the port: verifiers records the error on the episode; nothing raises."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environment = adapter.load_environment("textworld", "valid", 1, max_turns=3, **tw_kwargs)
    (episode,) = asyncio.run(adapter.evaluate(environment, model="none", base_url=f"http://127.0.0.1:{port}/v1"))
    (trace,) = episode.traces
    assert not episode.ok and trace.errors and trace.reward == 0.0
    assert trace.info["envrl"]["turns"] == 0


# ---- the real server and the real vf-eval command ------------------------------------------------


@pytest.mark.slow
def test_vf_eval_against_envrl_serve_model_with_the_tiny_checkpoint(tiny_checkpoint, tw_kwargs, tmp_path):
    """``envrl serve-model`` (the tiny random model, CPU) and ``vf-eval`` through
    ``python -m envrl.integrations.verifiers eval``, both on 127.0.0.1 as subprocesses: every
    episode's trace replays in a plain envrl env to the same observations and return."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "envrl.cli", "serve-model", str(tiny_checkpoint), "--port", "0", "--model-name", "tiny"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        line = server.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert match, line
        out = tmp_path / "runs"
        # vf-eval's parser wants each value as its own argument ("--flag value", not "--flag=value")
        flags = {
            "--env.taskset.env": "textworld",
            "--env.taskset.split": "valid",
            "--env.taskset.episodes": "2",
            "--env.taskset.max-turns": "3",
            "--env.taskset.env-kwargs": json.dumps(tw_kwargs),
            "--model": "tiny",
            "--client.base-url": f"http://127.0.0.1:{match.group(1)}/v1",
            "--sampling.temperature": "0",
            "--sampling.max-tokens": "16",
            "--output-dir": str(out),
        }
        command = [sys.executable, "-m", "envrl.integrations.verifiers", "eval", "--no-push", "--no-rich"]
        command += [item for pair in flags.items() for item in pair]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    (traces_file,) = out.glob("*/traces.jsonl")
    episodes = [json.loads(line) for line in traces_file.read_text().splitlines()]
    assert sorted(e["task"]["data"]["seed"] for e in episodes) == [0, 1]
    for episode in episodes:
        assert episode["ok"], episode["errors"]
        (trace,) = episode["traces"]
        data = trace["task"]["data"]
        messages = [node["message"] for node in trace["nodes"]]
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert len(replies) == 3 and trace["stop_condition"] == "envrl_truncated"  # gibberish, 3 turns
        actions = [parse_response(text).action or "" for text in replies]
        observations, total, info = _replay(tw_kwargs, data["task_id"], data["seed"], actions, max_turns=3)
        users = [m["content"] for m in messages if m["role"] == "user"]
        assert all(obs in message for obs, message in zip(observations, users)) and len(users) == 3
        assert trace["rewards"]["episode_return"]["score"] == pytest.approx(total)
        assert trace["metrics"]["success"] == float(info["success"])
        assert trace["metrics"]["turns"] == 3
