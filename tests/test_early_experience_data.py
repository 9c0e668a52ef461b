"""Early Experience data (envrl.training.early_experience): states reached by replaying the
expert prefix byte for byte on every env, alternatives that are never the expert's action,
dropped mismatches, determinism (also across workers), the killed-build resume, bad input.

The expert data is TextWorld's first two train games (tw-custom:train:0, 3 expert steps;
tw-goal:train:0, 4 steps) from the session's TextWorld cache, with K = 2."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("datasets")

import envrl  # noqa: E402,F401  (registers the ids)
from envrl.agents.prompts import Turn  # noqa: E402
from envrl.training import early_experience as ee  # noqa: E402
from envrl.training.data import collect_expert_data  # noqa: E402
from envrl.training.early_experience import (  # noqa: E402
    admissible_alternatives,
    build_early_experience,
    history_window,
    load_early_experience,
    normalise,
    replay_to,
)

COLUMNS = [
    "env",
    "split",
    "task_id",
    "seed",
    "episode",
    "step",
    "alternative",
    "instruction",
    "observation",
    "history",
    "messages",
    "admissible_actions",
    "expert_action",
    "expert_next_observation",
    "expert_reward",
    "action",
    "next_observation",
    "reward",
    "done",
]


@pytest.fixture(scope="module")
def tw(tw_cache):
    return {"cache_dir": str(tw_cache)}


@pytest.fixture(scope="module")
def expert_dir(tw, tmp_path_factory):
    return collect_expert_data(
        "textworld", "train", 2, tmp_path_factory.mktemp("expert"), agent="expert", env_kwargs=tw
    )


@pytest.fixture(scope="module")
def built(expert_dir, tmp_path_factory):
    return build_early_experience(
        "textworld", "train", expert_dir, tmp_path_factory.mktemp("ee") / "out", k=2, proposer="admissible"
    )


def _expert_rows(folder: Path) -> list[dict]:
    return pq.read_table(folder / "data.parquet").to_pylist()


def _rollout_bytes(folder: Path) -> bytes:
    return (folder / "rollout.parquet").read_bytes()


def test_rows_and_meta(built, expert_dir, tw):
    expert, rollout, meta = load_early_experience(built)
    rows = rollout.to_list()
    experts = _expert_rows(expert_dir)
    assert list(rows[0]) == COLUMNS
    # two alternatives for each of the 7 expert states, sorted by (episode, step, alternative)
    assert [(r["episode"], r["step"], r["alternative"]) for r in rows] == [
        (e, s, j) for e, n in ((0, 3), (1, 4)) for s in range(n) for j in range(2)
    ]
    by_state = {(r["episode"], r["step"]): r for r in experts}
    for row in rows:
        source = by_state[(row["episode"], row["step"])]
        assert row["observation"] == source["observation"] and row["messages"] == source["messages"]
        assert (row["expert_action"], row["expert_next_observation"], row["expert_reward"]) == (
            source["action"],
            source["next_observation"],
            source["reward"],
        )
        assert row["admissible_actions"] == source["admissible_actions"]
        assert (row["task_id"], row["seed"], row["instruction"]) == (
            source["task_id"],
            source["seed"],
            source["instruction"],
        )
        assert row["history"] == [
            {
                "observation": by_state[(row["episode"], s)]["observation"],
                "action": by_state[(row["episode"], s)]["action"],
            }
            for s in range(row["step"])
        ]
    # the recorded outcome is what the env gives for that action from that state
    env = gym.make("envrl/TextWorld-v0", split="train", **tw)
    for row in (rows[3], rows[13]):
        env.reset(seed=row["seed"], options={"task_id": row["task_id"]})
        for past in row["history"]:
            env.step(past["action"])
        observation, reward, terminated, truncated, _ = env.step(row["action"])
        assert (row["next_observation"], row["reward"], row["done"]) == (observation, reward, terminated or truncated)
    env.close()
    assert expert.to_list() == experts
    assert (built / "expert.parquet").read_bytes() == (expert_dir / "data.parquet").read_bytes()
    assert meta["counts"] == {
        "states": 7,
        "states_kept": 7,
        "dropped_mismatch": [],
        "alternatives": 14,
        "short_of_k": 0,
        "duplicates_dropped": 0,
    }
    expert_meta = (expert_dir / "meta.json").read_bytes()
    assert {k: meta[k] for k in ("env", "env_id", "split", "env_kwargs", "k", "proposer", "seed", "template")} == {
        "env": "textworld",
        "env_id": "envrl/TextWorld-v0",
        "split": "train",
        "env_kwargs": tw,
        "k": 2,
        "proposer": "admissible",
        "seed": 0,
        "template": "action",
    }
    assert meta["history"] == 2 and meta["expert_dir"] == str(expert_dir.resolve())
    assert meta["expert_meta_sha256"] == hashlib.sha256(expert_meta).hexdigest()
    assert meta["rule"] == "state i of episode e: alternatives drawn with default_rng([seed, e, i])"
    assert meta["envrl_version"] == envrl.__version__
    assert sorted(p.name for p in built.iterdir()) == ["expert.parquet", "meta.json", "rollout.parquet"]
    assert not list(built.parent.glob(".*"))  # the partial folder is gone


def test_alternatives_are_drawn_by_the_rule_and_never_the_experts(built):
    _, rollout, _ = load_early_experience(built)
    rows = rollout.to_list()
    states: dict[tuple[int, int], list[str]] = {}
    for row in rows:
        assert normalise(row["action"]) != normalise(row["expert_action"])
        assert row["action"] in row["admissible_actions"]
        states.setdefault((row["episode"], row["step"]), []).append(row["action"])
    for (episode, step), actions in states.items():
        row = next(r for r in rows if (r["episode"], r["step"]) == (episode, step))
        candidates = [a for a in row["admissible_actions"] if normalise(a) != normalise(row["expert_action"])]
        picked = np.random.default_rng([0, episode, step]).choice(len(candidates), size=2, replace=False)
        assert actions == [candidates[i] for i in picked]


def test_admissible_alternatives_normalise_and_fall_short():
    row = {
        "episode": 3,
        "step": 1,
        "action": "go north",
        "admissible_actions": ["Go North", "look", "go  north", "take key", "LOOK", "inventory"],
    }
    # 'Go North' and 'go  north' are the expert's; 'LOOK' repeats 'look': 3 candidates left
    alternatives, repeated = admissible_alternatives(row, 5, seed=0)
    assert sorted(alternatives) == ["inventory", "look", "take key"] and repeated == 1
    picked = np.random.default_rng([7, 3, 1]).choice(3, size=2, replace=False)
    assert admissible_alternatives(row, 2, seed=7) == ([["look", "take key", "inventory"][i] for i in picked], 1)
    assert admissible_alternatives({**row, "admissible_actions": ["GO north"]}, 2, seed=0) == ([], 0)


def _expert_episode(env_name: str, split: str, folder: Path, env_kwargs: dict) -> tuple[list[dict], dict]:
    """One expert episode's rows, and the env settings to replay it with (the plan left out)."""
    collect_expert_data(env_name, split, 1, folder, agent="expert", env_kwargs=env_kwargs)
    meta = json.loads((folder / "meta.json").read_text())
    return _expert_rows(folder), {k: v for k, v in meta["env_kwargs"].items() if k != "expert_plan"}


def _check_replays(env_name: str, split: str, tmp_path: Path, env_kwargs: dict) -> None:
    episode, kwargs = _expert_episode(env_name, split, tmp_path / "expert", env_kwargs)
    assert len(episode) >= 3
    env = gym.make(envrl.envs.ENV_IDS[env_name], split=split, **kwargs)
    try:
        assert all(replay_to(env, episode, step) for step in range(len(episode)))
        edited = [dict(r) for r in episode]
        edited[1]["observation"] += " "
        assert [replay_to(env, edited, step) for step in range(len(episode))] == [True] + [False] * (len(episode) - 1)
    finally:
        env.close()
    out = build_early_experience(
        env_name, split, tmp_path / "expert", tmp_path / "ee", k=1, proposer="admissible", env_kwargs=kwargs
    )
    counts = load_early_experience(out)[2]["counts"]
    assert counts["states_kept"] == counts["states"] == counts["alternatives"] == len(episode)


def test_replaying_reproduces_the_record_on_textworld(tw, tmp_path):
    _check_replays("textworld", "train", tmp_path, tw)


def test_replaying_reproduces_the_record_on_alfworld(with_official_data, tmp_path):
    _check_replays("alfworld", "valid_seen", tmp_path, {})


def test_replaying_reproduces_the_record_on_webshop(tmp_path):
    _check_replays("webshop", "test", tmp_path, {})


@pytest.mark.slow
def test_replaying_reproduces_the_record_on_scienceworld(tmp_path):
    _check_replays("scienceworld", "dev", tmp_path, {"task": "4-2", "java_heap": "256m"})


def _edit_expert(expert_dir: Path, folder: Path, episode: int, step: int, observation: str) -> Path:
    """A copy of the expert folder with one recorded observation replaced."""
    shutil.copytree(expert_dir, folder)
    table = pq.read_table(folder / "data.parquet")
    rows = table.to_pylist()
    for row in rows:
        if (row["episode"], row["step"]) == (episode, step):
            row["observation"] = observation
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), folder / "data.parquet")
    return folder


def _keep_rows(expert_dir: Path, folder: Path, states: set[tuple[int, int]]) -> Path:
    """A copy of the expert folder with only these (episode, step) rows."""
    shutil.copytree(expert_dir, folder)
    table = pq.read_table(folder / "data.parquet")
    rows = [r for r in table.to_pylist() if (r["episode"], r["step"]) in states]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), folder / "data.parquet")
    return folder


def test_a_state_the_env_does_not_reproduce_is_dropped_and_counted(built, expert_dir, tmp_path):
    edited = _edit_expert(expert_dir, tmp_path / "edited", 1, 2, "something else")
    out = build_early_experience("textworld", "train", edited, tmp_path / "out", k=2, proposer="admissible")
    _, rollout, meta = load_early_experience(out)
    # state 2 shows the edited observation, and state 3's prompt shows it in its history
    dropped = [
        {"task_id": "tw-goal:train:0", "episode": 1, "step": 2},
        {"task_id": "tw-goal:train:0", "episode": 1, "step": 3},
    ]
    assert meta["counts"] == {
        "states": 7,
        "states_kept": 5,
        "dropped_mismatch": dropped,
        "alternatives": 10,
        "short_of_k": 0,
        "duplicates_dropped": 0,
    }
    kept = load_early_experience(built)[1].to_list()
    assert rollout.to_list() == [r for r in kept if (r["episode"], r["step"]) not in {(1, 2), (1, 3)}]


def test_deterministic_and_independent_of_workers(built, expert_dir, tmp_path):
    again = build_early_experience("textworld", "train", expert_dir, tmp_path / "again", k=2, proposer="admissible")
    assert _rollout_bytes(again) == _rollout_bytes(built)
    assert (again / "meta.json").read_bytes() == (built / "meta.json").read_bytes()
    other = build_early_experience(
        "textworld", "train", expert_dir, tmp_path / "other", k=2, proposer="admissible", seed=1
    )
    first, second = load_early_experience(built)[1].to_list(), load_early_experience(other)[1].to_list()
    assert [r["action"] for r in first] != [r["action"] for r in second]
    assert [r["expert_action"] for r in first] == [r["expert_action"] for r in second]


@pytest.mark.slow
def test_workers_give_the_same_bytes(built, expert_dir, tmp_path):
    parallel = build_early_experience(
        "textworld", "train", expert_dir, tmp_path / "parallel", k=2, proposer="admissible", workers=2
    )
    assert _rollout_bytes(parallel) == _rollout_bytes(built)


def test_a_killed_build_resumes_from_its_shards(built, expert_dir, tmp_path, monkeypatch):
    played: list[int] = []
    real = ee.episode_rollouts

    def dies_on_episode_1(env, episode, alternatives):
        if episode[0]["episode"] == 1:
            raise KeyboardInterrupt
        played.append(episode[0]["episode"])
        return real(env, episode, alternatives)

    out = tmp_path / "out"
    monkeypatch.setattr(ee, "episode_rollouts", dies_on_episode_1)
    with pytest.raises(KeyboardInterrupt):
        build_early_experience("textworld", "train", expert_dir, out, k=2, proposer="admissible")
    partial = tmp_path / ".out.partial"
    assert not out.exists() and played == [0]
    assert sorted(p.name for p in (partial / "shards").iterdir()) == [
        "episode-000000000.json",
        "episode-000000000.parquet",
    ]

    def counted(env, episode, alternatives):
        played.append(episode[0]["episode"])
        return real(env, episode, alternatives)

    monkeypatch.setattr(ee, "episode_rollouts", counted)
    assert build_early_experience("textworld", "train", expert_dir, out, k=2, proposer="admissible") == out
    assert played == [0, 1] and not partial.exists()
    assert _rollout_bytes(out) == _rollout_bytes(built)
    assert (out / "meta.json").read_text() == (built / "meta.json").read_text()
    # the finished folder of the same build is returned as it is; another build is refused
    assert build_early_experience(
        "textworld", "train", expert_dir, out, k=2, proposer="admissible"
    ) == out and played == [0, 1]
    with pytest.raises(ValueError, match="already exists and is not this build's output"):
        build_early_experience("textworld", "train", expert_dir, out, k=1, proposer="admissible")


def test_a_partial_folder_of_other_settings_is_started_over(expert_dir, tmp_path, monkeypatch):
    def dies(env, episode, alternatives):
        raise KeyboardInterrupt

    monkeypatch.setattr(ee, "episode_rollouts", dies)
    with pytest.raises(KeyboardInterrupt):
        build_early_experience("textworld", "train", expert_dir, tmp_path / "out", k=2, proposer="admissible")
    monkeypatch.undo()
    out = build_early_experience("textworld", "train", expert_dir, tmp_path / "out", k=1, proposer="admissible")
    assert load_early_experience(out)[2]["counts"]["alternatives"] == 7


def test_bad_input_is_refused_in_one_sentence(expert_dir, tmp_path):
    def build(**kwargs):
        settings = {"env": "textworld", "split": "train", "expert_dir": expert_dir, "out_dir": tmp_path / "o", "k": 2}
        settings["proposer"] = "admissible"
        return build_early_experience(**{**settings, **kwargs})

    with pytest.raises(ValueError, match="k must be >= 1"):
        build(k=0)
    with pytest.raises(ValueError, match="holds textworld train expert data, not alfworld train: give the --env"):
        build(env="alfworld")
    with pytest.raises(ValueError, match="holds textworld train expert data, not textworld valid"):
        build(split="valid")
    with pytest.raises(ValueError, match="does not exist; give an `envrl data expert` folder"):
        build(expert_dir=tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="lacks data.parquet or meta.json"):
        build(expert_dir=tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown proposer 'random'; use one of policy, policy:PATH, admissible"):
        build(proposer="random")
    with pytest.raises(ValueError, match=r"^the default proposer samples the alternatives from the agent's own policy"):
        build_early_experience("textworld", "train", expert_dir, tmp_path / "o", k=2)  # no checkpoint named
    with pytest.raises(ValueError, match=r"--model PATH, or pass --proposer admissible to draw them uniformly"):
        build(proposer="policy")
    with pytest.raises(ValueError, match="samples nothing from --model m: drop one of the two"):
        build(model="m")
    with pytest.raises(ValueError, match="--proposer policy:a and --model b name two checkpoints: give one"):
        build(proposer="policy:a", model="b")
    with pytest.raises(ValueError, match="slots must be one of generate, literal, got 'free'"):
        build(slots="free")
    checkpoint = tmp_path / "model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=f"policy checkpoint {checkpoint} has no tokenizer"):
        build(proposer=f"policy:{checkpoint}")
    with pytest.raises(ValueError, match="is not a model folder"):
        build(proposer=f"policy:{tmp_path / 'nothing'}")
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.partial").exists()


def test_policy_proposer(expert_dir, tiny_checkpoint, tmp_path):
    """Draws of the tiny random model at the first expert state: d = 0, 1, ... seeded by
    draw_seed(0, 0, 0, d), the expert's action and repeats dropped, until K = 2 (at most 8)."""
    from envrl.agents.generation import SamplingConfig
    from envrl.agents.prompts import load_template

    first_state = _keep_rows(expert_dir, tmp_path / "expert", {(0, 0)})
    out = build_early_experience("textworld", "train", first_state, tmp_path / "out", k=2, model=tiny_checkpoint)
    _, rollout, meta = load_early_experience(out)
    rows = rollout.to_list()
    proposer = ee.PolicyProposer(str(tiny_checkpoint), load_template("action"))
    sampling = SamplingConfig(temperature=1.0)
    expected, dropped = [], 0
    for state in _expert_rows(first_state):
        actions, texts = state["admissible_actions"], [f"<action>{a}</action>" for a in state["admissible_actions"]]
        seen, found = {normalise(state["action"])}, []
        for d in range(8):
            (draw,) = proposer.backend.choose(
                [state["messages"]], [texts], sampling, seeds=[ee.draw_seed(0, 0, state["step"], d)]
            )
            action = actions[draw.choice]
            dropped += normalise(action) in seen
            if normalise(action) not in seen:
                seen.add(normalise(action))
                found.append(action)
            if len(found) == 2:
                break
        expected += [(state["step"], j, a) for j, a in enumerate(found)]
    assert [(r["step"], r["alternative"], r["action"]) for r in rows] == expected
    assert meta["counts"] == {
        "states": 1,
        "states_kept": 1,
        "dropped_mismatch": [],
        "alternatives": len(expected),
        "short_of_k": int(len(expected) < 2),
        "duplicates_dropped": dropped,
    }
    assert meta["proposer"] == f"policy:{tiny_checkpoint}" and len(meta["policy_weights_sha256"]) == 64
    assert meta["rule"].startswith("state i of episode e: draw d sampled with")


def test_the_default_proposer_is_the_policy_named_by_model(expert_dir, tiny_checkpoint, tmp_path, capsys):
    """The paper samples alternatives from the agent's own policy: naming a checkpoint is enough,
    and the result is the very folder ``policy:PATH`` builds (same rows, same settings)."""
    first_state = _keep_rows(expert_dir, tmp_path / "expert", {(0, 0), (0, 1)})
    assert ee.resolve_proposer(model=tiny_checkpoint) == f"policy:{tiny_checkpoint}"
    by_model = build_early_experience("textworld", "train", first_state, tmp_path / "a", k=2, model=tiny_checkpoint)
    named = build_early_experience(
        "textworld", "train", first_state, tmp_path / "b", k=2, proposer=f"policy:{tiny_checkpoint}"
    )
    assert (by_model / "rollout.parquet").read_bytes() == (named / "rollout.parquet").read_bytes()
    meta = load_early_experience(by_model)[2]
    assert meta["proposer"] == f"policy:{tiny_checkpoint}" and meta["slots"] == "generate"
    rows = load_early_experience(by_model)[1].to_list()
    assert rows and all(normalise(r["action"]) != normalise(r["expert_action"]) for r in rows)
    assert all(r["action"] in r["admissible_actions"] for r in rows)  # TextWorld lists no slot
    parser = argparse.ArgumentParser()
    ee.add_arguments(parser)
    args = ["--env", "textworld", "--expert", str(first_state), "--k", "2", "--no-progress"]
    assert ee.run(parser.parse_args([*args, "--out", str(tmp_path / "c"), "--model", str(tiny_checkpoint)])) == 0
    assert (tmp_path / "c" / "rollout.parquet").read_bytes() == (by_model / "rollout.parquet").read_bytes()
    capsys.readouterr()
    assert ee.run(parser.parse_args([*args, "--out", str(tmp_path / "d")])) == 2
    assert capsys.readouterr().err == f"envrl data early-experience: error: {ee.NO_POLICY}\n"
    assert not (tmp_path / "d").exists()


def test_slot_text_is_cut_and_cleaned():
    from envrl.agents.prompts import load_template

    assert ee.clean_slot("  red  shoes] and more", "]") == "red shoes"
    assert ee.clean_slot("blue [wool]\nnext line", "]") == "blue wool"
    assert ee.clean_slot("a\ufffdb </action>", "]") == "ab"
    assert ee.clean_slot("]", "]") == ""
    assert ee.slot_head(load_template("action"), "search[<query>]") == ("<action>search[", "]")
    assert ee.slot_head(load_template("action"), "click[buy now]") is None


@pytest.fixture(scope="module")
def webshop_search_page(tmp_path_factory):
    """WebShop expert data cut to its first state: the search page, which lists only search[<query>]."""
    folder = tmp_path_factory.mktemp("ws")
    expert = collect_expert_data("webshop", "train", 1, folder / "expert", template="action", history=2)
    return _keep_rows(expert, folder / "first", {(0, 0)})


def test_the_policy_writes_its_own_search_query(webshop_search_page, tiny_checkpoint, tmp_path):
    """At WebShop's search page the policy proposer sends search[<the tiny model's own text>]:
    seeded (draw d's seed, then torch.manual_seed of it), reproducible, and accepted by the env."""
    from envrl.agents.prompts import load_template

    (state,) = _expert_rows(webshop_search_page)
    assert state["admissible_actions"] == ["search[<query>]"] and state["action"].startswith("search[")
    out = build_early_experience("webshop", "train", webshop_search_page, tmp_path / "a", k=3, model=tiny_checkpoint)
    rows = load_early_experience(out)[1].to_list()
    proposer = ee.PolicyProposer(str(tiny_checkpoint), load_template("action"))
    expected, seen = [], {normalise(state["action"])}
    for d in range(12):
        query = proposer.fill(state["messages"], "search[<query>]", ee.draw_seed(0, 0, 0, d))
        if query is not None and normalise(query) not in seen and len(expected) < 3:
            seen.add(normalise(query))
            expected.append(query)
    assert [r["action"] for r in rows] == expected and len(expected) == 3
    for action in expected:
        assert action.startswith("search[") and action.endswith("]") and action != "search[<query>]"
        assert ee.clean_slot(action[len("search[") : -1], "]") == action[len("search[") : -1] != ""
    again = build_early_experience("webshop", "train", webshop_search_page, tmp_path / "b", k=3, model=tiny_checkpoint)
    assert (again / "rollout.parquet").read_bytes() == (out / "rollout.parquet").read_bytes()
    env = gym.make("envrl/WebShop-v0", split="train")
    for row in rows:
        env.reset(seed=int(row["seed"]), options={"task_id": row["task_id"]})
        observation, _, _, _, info = env.step(row["action"])
        assert info["valid_action"] and observation == row["next_observation"]
    env.close()
    literal = build_early_experience(
        "webshop", "train", webshop_search_page, tmp_path / "c", k=3, model=tiny_checkpoint, slots="literal"
    )
    assert [r["action"] for r in load_early_experience(literal)[1].to_list()] == ["search[<query>]"]
    assert load_early_experience(literal)[2]["slots"] == "literal"


def test_training_on_admissible_alternatives_says_so(built, caplog):
    from envrl.training.early_experience_data import read_early_experience

    with caplog.at_level("WARNING", logger="envrl.training.early_experience_data"):
        data = read_early_experience(built, "iwm")
    assert data.meta["proposer"] == "admissible" and len(data.rollout) == 14
    assert caplog.messages == [
        f"{built}: the alternatives were drawn uniformly from the admissible actions (--proposer admissible), "
        "not sampled from the policy as the paper's are"
    ]


def test_history_window():
    row = {"history": [{"observation": f"o{i}", "action": f"a{i}"} for i in range(3)]}
    assert history_window(row, 2) == [Turn("o1", "a1"), Turn("o2", "a2")]
    assert history_window(row, 5) == [Turn(f"o{i}", f"a{i}") for i in range(3)]
    assert history_window(row, 0) == [] and history_window({"history": []}, 2) == []
    with pytest.raises(ValueError, match="history must be >= 0"):
        history_window(row, -1)


def test_loading_another_folder_is_refused(expert_dir, tmp_path):
    with pytest.raises(ValueError, match="does not exist: it is not an Early Experience folder"):
        load_early_experience(tmp_path / "nothing")
    with pytest.raises(ValueError, match="lacks expert.parquet, rollout.parquet: it is not an Early Experience folder"):
        load_early_experience(expert_dir)


def test_command_line(expert_dir, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    ee.add_arguments(parser)
    args = ["--env", "textworld", "--expert", str(expert_dir), "--out", str(tmp_path / "o"), "--no-progress"]
    args += ["--proposer", "admissible"]
    assert ee.run(parser.parse_args([*args, "--k", "2", "--seed", "3"])) == 0
    assert capsys.readouterr().out == (
        f"wrote 14 alternatives from 7 of 7 expert states to {tmp_path / 'o' / 'rollout.parquet'} "
        "(0 dropped: replay mismatch; 0 short of k)\n"
    )
    assert ee.run(parser.parse_args([*args, "--k", "0"])) == 2
    assert (
        capsys.readouterr().err
        == "envrl data early-experience: error: k must be >= 1 (alternatives per expert state), got 0\n"
    )
    assert ee.run(parser.parse_args([*args, "--k", "2", "--env-arg", "oops"])) == 2
    assert "--env-arg takes KEY=VALUE" in capsys.readouterr().err
