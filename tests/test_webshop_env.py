"""envrl/WebShop-v0: the contract, the oracle, and the same episode through all three transports."""

from __future__ import annotations

import socket

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envrl  # noqa: F401  (registers the ids)
from envrl.agents import make_agent
from envrl.envs.base import INFO_KEYS
from envrl.envs.webshop.env import WebShopEnv, choose_goal_options
from envrl.envs.webshop.transports import LocalServer, WebShopConnectionError


def _play(env: gym.Env, task_id: str, agent_spec: str = "expert", max_steps: int = 15) -> list[tuple]:
    """Play one episode; return (action, observation, reward, terminated) per step, reset first."""
    agent = make_agent(agent_spec, env_name="webshop", seed=0)
    agent.reset(seed=0)
    observation, info = env.reset(options={"task_id": task_id})
    trace = [("<reset>", observation, 0.0, False)]
    for _ in range(max_steps):
        action = agent.act(observation, info)
        observation, reward, terminated, truncated, info = env.step(action)
        trace.append((action, observation, reward, terminated))
        if terminated or truncated:
            break
    return trace


@pytest.mark.parametrize("split", ["train", "eval", "test", "test_ood"])
def test_check_env(split):
    env = gym.make("envrl/WebShop-v0", split=split).unwrapped
    check_env(env, skip_render_check=True)
    env.close()


def test_info_keys_and_clickables():
    env = gym.make("envrl/WebShop-v0", split="test")
    observation, info = env.reset(seed=3)
    assert set(INFO_KEYS) <= set(info)
    assert info["task_id"].startswith("fixed_") and info["split"] == "test"
    assert info["has_search_bar"] and "search[<query>]" in info["admissible_actions"]
    assert info["instruction"] and info["instruction"] in observation
    assert observation.startswith("WebShop [SEP] Instruction: [SEP] ")
    env.close()


def test_oracle_buys_the_goal_and_reward_info_is_verbose():
    env = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    trace = _play(env, env.unwrapped.task_ids[0])
    action, observation, reward, terminated = trace[-1]
    info = env.unwrapped._last_info
    assert terminated and action == "click[buy now]"
    assert info["score"] == min(reward, 1.0) and info["success"] == (reward >= 1.0)
    assert {"r_type", "r_att", "w_att", "query_match", "category_match", "title_score"} <= set(info["reward_info"])
    # the page's reward is the store's reward for what was bought
    store = env.unwrapped.store
    goal_index = int(info["task_id"].split("_")[1])
    options = env.unwrapped._best_options()
    assert reward == pytest.approx(store.reward(goal_index, store.goals[goal_index]["asin"], options)[0])
    env.close()


def test_oracle_scores_one_on_the_first_100_test_goals():
    env = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    task_ids = env.unwrapped.task_ids
    assert len(task_ids) == 500
    wins = sum(_play(env, task_id)[-1][2] == 1.0 for task_id in task_ids[:100])
    assert wins == 100, f"the oracle scored 1.0 on {wins}/100 test goals"
    env.close()


@pytest.mark.slow
def test_oracle_on_all_test_goals():
    """The README's claim: 500/500 built-in test goals at 1.0."""
    env = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    wins = sum(_play(env, task_id)[-1][2] == 1.0 for task_id in env.unwrapped.task_ids)
    assert wins == 500, f"the oracle scored 1.0 on {wins}/500 test goals"
    env.close()


def _offers(product: dict, name: str, value: str) -> bool:
    return value.casefold() in {v.casefold() for v in (product.get("options") or {}).get(name, [])}


@pytest.mark.parametrize("split, count", [("test", 500), ("eval", 500)])
def test_oracle_chooses_the_goals_own_options(split, count):
    """The oracle's episodes are demonstrations: it clicks exactly the goal's option values
    wherever the product offers them, never another value the reward would also accept."""
    env = gym.make("envrl/WebShop-v0", split=split, expert_plan=True)
    oracle, store = env.unwrapped, env.unwrapped.store
    checked = 0
    for task_id in oracle.task_ids[:count]:
        env.reset(options={"task_id": task_id})
        goal = store.goals[int(task_id.split("_")[1])]
        product = store.by_asin[goal["asin"]]
        chosen = oracle._best_options()
        wanted = {name: value for name, value in goal["goal_options"].items() if _offers(product, name, value)}
        assert {k: v.casefold() for k, v in chosen.items()} == {k: v.casefold() for k, v in wanted.items()}, (
            task_id,
            goal["goal_options"],
            chosen,
        )
        checked += bool(wanted)
    assert checked >= 0.9 * count  # most goals name options the product offers
    env.close()


def test_oracle_buys_the_goals_own_options_in_its_episodes():
    env = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    store = env.unwrapped.store
    for task_id in env.unwrapped.task_ids[:40]:
        action, _, reward, terminated = _play(env, task_id)[-1]
        assert terminated and action == "click[buy now]" and reward >= 1.0
        goal = store.goals[int(task_id.split("_")[1])]
        assert env.unwrapped._page.options == goal["goal_options"], task_id
    env.close()


RUG = {
    "color": ["snow white", "turquoise", "navy blue", "terracotta"],
    "shape": ["square", "round", "octagon", "oval", "rectangular", "rectangular runner"],
    "size": ["8 ft 0 x 8 ft 0", "7 ft", "2 ft 6 in x 10 ft", "8 x 10 ft"],
}


SIZES = {"size": ["x-large", "large tall"]}


@pytest.mark.parametrize(
    "groups, goal_options, expected",
    [
        # human goals (plain lists): exact values, case and spacing aside, wherever they are offered
        (
            RUG,
            ["Navy  Blue", "rectangular", "8 x 10 ft"],
            {"color": "navy blue", "shape": "rectangular", "size": "8 x 10 ft"},
        ),
        (RUG, ["round"], {"shape": "round"}),  # groups the goal does not name are left alone
        # not offered: the closest value, in the group where it is closest
        (
            RUG,
            ["turquoise", "octagonal", "8 ft 0 x 8 ft 0 square"],
            {"color": "turquoise", "shape": "octagon", "size": "8 ft 0 x 8 ft 0"},
        ),
        # nothing close ("hexagon" ~ "octagon" is chance): no click rather than a guess
        (RUG, ["purple", "hexagon"], {}),
        # synthetic goals name the group; "large" is closer to "x-large" than to "large tall"
        (SIZES, {"size": "large"}, {"size": "x-large"}),
        (RUG, {"color": "Terracotta", "size": "7 ft"}, {"color": "terracotta", "size": "7 ft"}),
    ],
)
def test_choose_goal_options(groups, goal_options, expected):
    assert choose_goal_options(groups, goal_options, score=lambda chosen: 0.0) == expected


def test_the_score_only_breaks_ties():
    # a score that prefers another value never beats the goal's own value ...
    prefers_black = lambda chosen: float(chosen.get("color") == "black")  # noqa: E731
    assert choose_goal_options({"color": ["black", "white"]}, {"color": "white"}, prefers_black) == {"color": "white"}
    # ... but decides between values equally close to it, else the first in page order wins
    groups = {"color": ["navy blue", "blue navy"]}
    assert choose_goal_options(groups, {"color": "navy"}, lambda c: float(c["color"] == "blue navy")) == {
        "color": "blue navy"
    }
    assert choose_goal_options(groups, {"color": "navy"}, lambda c: 0.0) == {"color": "navy blue"}


@pytest.mark.parametrize(
    "action, feedback",
    [
        ("click[no such button]", "is not clickable on this page"),
        ("buy the red shoes", "write search[keywords] or click[an item on the page]"),
        ("search[]", "needs keywords"),
        ("click[search]", "to search, write search[your keywords]"),
        ("x" * 5000, "characters (the limit is 1024)"),
    ],
)
def test_invalid_actions_are_noops_with_feedback(action, feedback):
    env = gym.make("envrl/WebShop-v0", split="test")
    first, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step(action)
    assert feedback in observation and not info["valid_action"] and reward == 0.0 and not terminated
    # the page did not change: a valid action still works from where we were
    observation, *_ = env.step("search[shampoo]")
    assert env.unwrapped._page.kind == "results"
    env.close()


def test_search_without_search_bar_and_after_done():
    env = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    _, info = env.reset(seed=1)
    observation, *_, info = env.step(info["expert_plan"][0])
    observation, *_, info = env.step("search[more]")
    assert "no search bar" in observation and not info["valid_action"]
    for _ in range(14):
        observation, reward, terminated, truncated, info = env.step(info["expert_plan"][0])
        if terminated:
            break
    assert terminated
    observation, reward, terminated, truncated, info = env.unwrapped.step("click[back to search]")
    assert "episode is over" in observation and reward == 0.0
    env.close()


def test_step_limit_is_15():
    env = gym.make("envrl/WebShop-v0", split="test")
    env.reset(seed=0)
    truncations = [env.step("click[nothing]")[3] for _ in range(15)]
    assert truncations == [False] * 14 + [True]
    env.close()


def test_unknown_task_and_split_are_clear_errors():
    env = gym.make("envrl/WebShop-v0", split="test")
    with pytest.raises(ValueError, match="unknown task id"):
        env.reset(options={"task_id": "fixed_999999"})
    with pytest.raises(ValueError, match="train"):
        gym.make("envrl/WebShop-v0", split="nope")
    with pytest.raises(ValueError, match="observation_mode"):
        gym.make("envrl/WebShop-v0", observation_mode="pixels")
    env.close()


def test_seed_picks_the_task_deterministically():
    env = gym.make("envrl/WebShop-v0", split="eval")
    ids = [env.reset(seed=s)[1]["task_id"] for s in (5, 6, 7, 8, 5)]
    assert ids[0] == ids[-1] and len(set(ids)) > 2  # the seed decides, and seeds differ
    env.close()


@pytest.mark.parametrize("mode", ["text", "text_rich", "html"])
def test_same_episode_in_process_and_over_http(mode):
    inprocess = gym.make("envrl/WebShop-v0", split="test", observation_mode=mode, expert_plan=True)
    server = LocalServer(inprocess.unwrapped._transport._client.application)
    try:
        http = gym.make(
            "envrl/WebShop-v0", split="test", observation_mode=mode, server_url=server.url, expert_plan=True
        )
        task_id = inprocess.unwrapped.task_ids[7]
        assert _play(inprocess, task_id) == _play(http, task_id)
        http.close()
    finally:
        server.close()
        inprocess.close()


def test_dead_server_is_a_clear_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = gym.make("envrl/WebShop-v0", split="test", server_url=f"http://127.0.0.1:{port}")
    with pytest.raises(WebShopConnectionError, match="cannot reach the WebShop server"):
        env.reset(seed=0)
    env.close()


def test_mode_arguments_are_checked():
    with pytest.raises(ValueError, match="server_url"):
        WebShopEnv(split="test", mode="http")
    with pytest.raises(ValueError, match="mode"):
        WebShopEnv(split="test", mode="carrier-pigeon")


@pytest.mark.browser
@pytest.mark.parametrize("mode", ["text", "text_rich"])
def test_same_episode_in_the_browser(mode):
    inprocess = gym.make("envrl/WebShop-v0", split="test", observation_mode=mode, expert_plan=True)
    browser = gym.make("envrl/WebShop-v0", split="test", observation_mode=mode, mode="browser", expert_plan=True)
    try:
        task_id = inprocess.unwrapped.task_ids[3]
        assert _play(browser, task_id) == _play(inprocess, task_id)
    finally:
        browser.close()
        inprocess.close()


def test_a_screened_action_keeps_the_envs_own_info_keys():
    """The base class screens over-long and non-text actions; the expert's plan must survive them."""
    env = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    _, before = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step(12345)
    assert observation.startswith("Invalid action: expected text") and not info["valid_action"]
    assert info["expert_plan"] == before["expert_plan"] and info["step"] == 1 and info["has_search_bar"]
    env.close()
