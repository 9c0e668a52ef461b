"""``envrl/ScienceWorld-v0`` on the real simulator (scienceworld 1.2.3, one JVM per env).

Covers the env contract on each split, the gold-path expert, determinism across processes,
equality with the stock engine, bad input, JVM hygiene (close, exit, a killed parent, a
killed JVM) and the lazy admissible-action list.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

pytest.importorskip("scienceworld")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("ScienceWorld needs Java", allow_module_level=True)

import envrl  # noqa: E402,F401
from envrl.agents import make_agent  # noqa: E402
from envrl.envs.base import INFO_KEYS, MAX_ACTION_LENGTH  # noqa: E402
from envrl.envs.scienceworld import Engine, EngineDiedError  # noqa: E402
from envrl.envs.scienceworld.engine import java_heap_option  # noqa: E402
from envrl.envs.scienceworld.env import (  # noqa: E402
    LazyAdmissibleActions,
    ScienceWorldEnv,
    StaleAdmissibleActionsError,
)
from envrl.envs.scienceworld.tasks import MAX_VARIATIONS, SPLITS, all_tasks, split_variations  # noqa: E402

ENV_ID = "envrl/ScienceWorld-v0"
if ENV_ID not in gym.registry:  # until envrl.envs registers it
    gym.register(
        id=ENV_ID,
        entry_point="envrl.envs.scienceworld.env:ScienceWorldEnv",
        max_episode_steps=100,
        disable_env_checker=True,
    )

# java processes this test module started (checked at the end)
_STARTED_JVMS: list[int] = []


def _jvm_running(pid: int) -> bool:
    """True if ``pid`` is a live (not zombie) java process."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            status = handle.read()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read()
    except OSError:
        return False
    state = next((line.split()[1] for line in status.splitlines() if line.startswith("State:")), "?")
    return state not in ("Z", "X") and b"scienceworld" in cmdline


def _child_jvms() -> list[int]:
    """Live scienceworld JVMs whose parent is this process."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent == os.getpid() and _jvm_running(int(entry)):
                found.append(int(entry))
    return found


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _jvm_running(pid):
            return True
        time.sleep(0.1)
    return False


def _play(env, agent, task_id):
    observation, info = env.reset(options={"task_id": task_id})
    agent.reset(seed=0)
    terminated = truncated = False
    while not (terminated or truncated):
        observation, reward, terminated, truncated, info = env.step(agent.act(observation, info))
    return info


@pytest.fixture(scope="module")
def shared_env():
    """One env (one JVM) for the tests that only need some env."""
    env = gym.make(
        ENV_ID, task=["find-non-living-thing", "power-component", "find-animal"], split="train", expert_plan=True
    )
    env.reset(seed=0)
    _STARTED_JVMS.append(env.unwrapped.engine.pid)
    yield env
    env.close()


# ---- tasks and splits --------------------------------------------------------------------


def test_task_table_and_splits_match_the_engine():
    engine = Engine()
    _STARTED_JVMS.append(engine.pid)
    try:
        assert sorted(engine.task_names()) == sorted(t.name for t in all_tasks()) == sorted(MAX_VARIATIONS)
        for task in all_tasks():
            assert engine.max_variations(task.name) == MAX_VARIATIONS[task.name], task.name
            engine_splits = engine.split_variations(task.name)
            for split in SPLITS:
                assert split_variations(task.name, split) == engine_splits[split], (task.name, split)
    finally:
        engine.close()
    assert [t.id for t in all_tasks()][:3] == ["1-1", "1-2", "1-3"] and all_tasks()[-1].id == "10-2"


@pytest.mark.parametrize("split", SPLITS)
def test_check_env_on_each_split(split):
    env = gym.make(ENV_ID, task="find-non-living-thing", split=split)
    try:
        check_env(env.unwrapped, skip_render_check=True)
        observation, info = env.reset(seed=1)
        _STARTED_JVMS.append(env.unwrapped.engine.pid)
        assert observation.startswith("This room is called")
        assert set(INFO_KEYS) <= set(info)
        task_id = info["task_id"]
        variation = int(task_id.split(":")[1])
        assert task_id.startswith("4-2:") and variation in split_variations("find-non-living-thing", split)
        assert info["task_type"] == "find-non-living-thing" and info["split"] == split
        assert info["instruction"].startswith("Your task is to find a(n) non-living thing")
        assert env.spec.max_episode_steps == 100
        # the seed picks the task deterministically
        assert env.reset(seed=1)[1]["task_id"] == task_id
    finally:
        env.close()


def test_all_tasks_span_the_split_and_aliases_resolve():
    env = ScienceWorldEnv(split="test")  # no JVM until reset
    ids = env.task_ids
    assert len(ids) == sum(len(split_variations(t.name, "test")) for t in all_tasks())
    # round-robin over tasks: the first 30 ids are one variation of each of the 30 tasks
    assert ids[0] == "1-1:21" and len({i.split(":")[0] for i in ids[:30]}) == 30
    assert env._choose_task({"task_id": "boil:25"}) == "1-1:25"
    assert env.engine is None


@pytest.mark.parametrize("heap", ["1k", "abc", "-5m", 0, "63m", 1024, "1.5g", "2 g", True, 1.5, []])
def test_bad_java_heaps_raise_one_clear_value_error(heap):
    with pytest.raises(ValueError) as caught:
        ScienceWorldEnv(java_heap=heap)
    message = str(caught.value)
    assert "'512m' or '2g'" in message and "at least '64m'" in message and f"got {heap!r}" in message
    assert "int()" not in message


def test_java_heap_sizes_that_work():
    for heap, option in [
        ("64m", ["-Xmx64m"]),
        (" 2G ", ["-Xmx2g"]),
        ("0512m", ["-Xmx512m"]),
        (512 << 20, [f"-Xmx{512 << 20}"]),
        (None, []),
        ("", []),
    ]:
        assert ScienceWorldEnv(java_heap=heap).engine is None
        assert Engine.check_options(java_heap=heap) is None
        assert java_heap_option(heap) == option, heap
    with pytest.raises(ValueError, match="at least '256m' with expert_plan=True"):
        ScienceWorldEnv(java_heap="128m", expert_plan=True)
    assert ScienceWorldEnv(java_heap="256m", expert_plan=True).engine is None


def test_a_jvm_that_refuses_its_heap_says_so():
    from envrl.envs.scienceworld import EngineStartError

    before = set(_child_jvms())
    with pytest.raises(EngineStartError, match="Too small maximum heap") as caught:
        Engine(java_options=["-Xmx1k"])  # past the java_heap check: the JVM's own complaint comes through
    assert "int()" not in str(caught.value)
    assert set(_child_jvms()) <= before


def test_unknown_tasks_and_options_raise_clear_value_errors():
    with pytest.raises(ValueError, match="unknown ScienceWorld task 'nope'"):
        gym.make(ENV_ID, task="nope")
    with pytest.raises(ValueError, match="unknown ScienceWorld split"):
        ScienceWorldEnv(split="valid")
    with pytest.raises(ValueError, match="simplification"):
        ScienceWorldEnv(simplifications="flying")
    with pytest.raises(ValueError, match="noElectricalAction"):
        ScienceWorldEnv(task="power-component", simplifications="noElectricalAction")
    with pytest.raises(ValueError, match="java_heap"):
        ScienceWorldEnv(java_heap="lots")
    env = ScienceWorldEnv(task="boil", split="train")
    for bad, message in [
        ("1-1:25", r"in split \['test'\]"),
        ("1-1:999", "variations 0-29"),
        ("boil", "look like"),
        ("2-1:3", "not among this env's tasks"),
        ("x:1", "unknown"),
    ]:
        with pytest.raises(ValueError, match=message):
            env.reset(options={"task_id": bad})
    assert env.engine is None  # rejected before any JVM started


# ---- playing -----------------------------------------------------------------------------


def test_expert_completes_tasks():
    agent = make_agent("expert")
    env = gym.make(ENV_ID, task=["4-2", "3-1", "7-1"], split="dev", **agent.env_kwargs)
    try:
        for task_id in ["4-2:150", "3-1:10", "7-1:62"]:
            info = _play(env, agent, task_id)
            assert info["success"] and info["score"] == 1.0 and info["raw_score"] == 100, task_id
            assert info["expert_plan"] == []
        _STARTED_JVMS.append(env.unwrapped.engine.pid)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("family", range(1, 11))
def test_expert_completes_a_sampled_variation_of_every_family(family):
    rng = random.Random(family)
    task = rng.choice([t for t in all_tasks() if t.family == family])
    split = rng.choice(SPLITS)
    variations = split_variations(task.name, split) or split_variations(task.name, "train")
    split = split if split_variations(task.name, split) else "train"
    task_id = f"{task.id}:{rng.choice(variations)}"
    agent = make_agent("expert")
    env = gym.make(ENV_ID, task=task.id, split=split, max_episode_steps=400, **agent.env_kwargs)
    try:
        info = _play(env, agent, task_id)
        assert info["success"], (task_id, info["raw_score"])
    finally:
        env.close()


def test_rewards_scores_and_termination(shared_env):
    observation, info = shared_env.reset(options={"task_id": "3-1:0"})
    total = info["score"]
    terminated = False
    while not terminated:
        observation, reward, terminated, truncated, info = shared_env.step(info["expert_plan"][0])
        total += reward
    assert info["success"] and abs(total - 1.0) < 1e-9
    # focusing on the wrong thing fails the task: the engine's -100 is clipped to a score of 0
    shared_env.reset(options={"task_id": "3-1:0"})
    shared_env.step("go to workshop")
    observation, reward, terminated, truncated, info = shared_env.step("focus on battery")
    assert info["raw_score"] == -100 and info["score"] == 0.0 and terminated and not info["success"]


BAD_ACTIONS = [
    "",
    "   ",
    "asdkjh",
    "\x00",
    "é ü 漢字",
    "look around\nlook around",
    "\r\n",
    "focus on",
    "🙂" * 50,
    "\ud800",
    "x" * MAX_ACTION_LENGTH,
]


def test_bad_actions_give_feedback_not_crashes(shared_env):
    observation, info = shared_env.reset(options={"task_id": "4-2:0"})
    for action in BAD_ACTIONS:
        observation, reward, terminated, truncated, info = shared_env.step(action)
        assert isinstance(observation, str) and observation, repr(action)
        assert info["valid_action"] is False and reward == 0.0 and not terminated, repr(action)
    for action in ["y" * (1 << 20), None, 123, b"look around", ["look around"]]:
        observation, reward, terminated, truncated, info = shared_env.step(action)
        assert observation.startswith("Invalid action") and info["valid_action"] is False
    # an ambiguous request is understood (it asks for a number), and the number resolves it
    shared_env.reset(options={"task_id": "4-2:0"})
    observation, _, _, _, info = shared_env.step("open door")
    assert observation.startswith("Ambiguous request") and info["valid_action"]
    observation, _, _, _, info = shared_env.step("0")
    assert observation == "The door is already open." and info["valid_action"]  # easy: doors are open


# ---- the lazy admissible actions ------------------------------------------------------------


def test_lazy_admissible_actions(shared_env):
    observation, info = shared_env.reset(options={"task_id": "4-2:0"})
    actions = info["admissible_actions"]
    assert isinstance(actions, LazyAdmissibleActions) and isinstance(actions, list) and not actions.computed
    assert "look around" in actions and len(actions) > 100 and actions.computed
    assert actions == sorted(actions) and list(actions) == actions[:]
    copied = pickle.loads(pickle.dumps(info))
    assert type(copied["admissible_actions"]) is list and copied["admissible_actions"] == actions
    # a list read after the env moved on cannot be computed any more
    _, _, _, _, info = shared_env.step("look around")
    stale = info["admissible_actions"]
    shared_env.step("inventory")
    with pytest.raises(StaleAdmissibleActionsError, match="before the next step") as caught:
        len(stale)
    assert "list(info['admissible_actions'])" in str(caught.value) and "admissible='eager'" in str(caught.value)
    for use in (json.dumps, list, pickle.dumps, copy.deepcopy, lambda x: x + ["x"], lambda x: ["x"] + x):
        with pytest.raises(StaleAdmissibleActionsError):
            use(stale)
    assert repr(stale).startswith("<admissible actions not available: info['admissible_actions'] of step 1")
    # pickling (vector envs) reads the list
    _, _, _, _, info = shared_env.step("look around")
    assert len(pickle.loads(pickle.dumps(info["admissible_actions"]))) > 100


def _unread_step(env, engine_lists: list[list[str]]) -> dict:
    """Step, and return the info with its list unread; the engine's own list of that state goes to engine_lists."""
    info = env.step("look around")[4]
    assert type(info["admissible_actions"]) is LazyAdmissibleActions and not info["admissible_actions"].computed
    engine_lists.append(env.unwrapped.engine.valid_actions(keep_random_state=True))
    return info


def _add_in_place(actions: list[str]) -> list[str]:
    actions += ["x"]
    return list(actions)


def _change(actions: list[str]) -> list[str]:
    actions.append("x")
    actions.insert(0, "y")
    del actions[1]
    actions[2] = "z"
    actions.remove("look around")
    actions.sort(key=len)
    return list(actions)


def _shuffle(actions: list[str]) -> list[str]:
    random.Random(1).shuffle(actions)
    return list(actions)


# every way a user or a recorder reads (or changes) a list, to compare with a plain list's answer
LIST_USES = {
    "json compact": lambda a, info: json.loads(json.dumps(info))["admissible_actions"],
    "json indent": lambda a, info: json.loads(json.dumps(info, indent=2))["admissible_actions"],
    "json of the list": lambda a, info: json.loads(json.dumps(a, ensure_ascii=False)),
    "list + list": lambda a, info: a + ["x"],
    "list + lazy": lambda a, info: ["x"] + a,
    "sum": lambda a, info: sum([a], []),
    "+=": lambda a, info: _add_in_place(a),
    "unpack": lambda a, info: [*a],
    "list()": lambda a, info: list(a),
    "tuple()": lambda a, info: tuple(a),
    "sorted": lambda a, info: sorted(a, key=len),
    "reversed": lambda a, info: list(reversed(a)),
    "join": lambda a, info: "\n".join(a),
    "for": lambda a, info: [action for action in a],
    "len": lambda a, info: len(a),
    "bool": lambda a, info: bool(a),
    "in": lambda a, info: ("look around" in a, "fly" in a),
    "index": lambda a, info: (a[0], a[-1], a[5], a[2:9], a[::-50]),
    "index()": lambda a, info: (a.index("look around"), a.count("look around")),
    "repeat": lambda a, info: (2 * a, a * 2),
    "random.choice": lambda a, info: random.Random(3).choice(a),
    "random.sample": lambda a, info: random.Random(3).sample(a, 5),
    "numpy": lambda a, info: np.array(a).tolist(),
    "pickle": lambda a, info: pickle.loads(pickle.dumps(info))["admissible_actions"],
    "deepcopy": lambda a, info: copy.deepcopy(info)["admissible_actions"],
    "copy": lambda a, info: (copy.copy(a), a.copy()),
    "repr": lambda a, info: repr(a),
    "str": lambda a, info: f"{a}",
    "change": lambda a, info: _change(a),
    "pop": lambda a, info: (a.pop(), a.pop(0), list(a)),
    "clear": lambda a, info: (a.clear(), list(a)),
    "shuffle": lambda a, info: _shuffle(a),
    "== list": lambda a, info: (a == info["plain"], info["plain"] == a, a != info["plain"], info["plain"] != a),
    "ordering": lambda a, info: (a < info["plain"] + ["x"], info["plain"] + ["x"] > a, a <= info["plain"]),
}


@pytest.mark.parametrize("use", list(LIST_USES))
def test_lazy_lists_behave_as_lists(shared_env, use):
    """Each use of an unread list gives what the same use of the eager list gives, and plain types."""
    shared_env.reset(options={"task_id": "4-2:0"})
    engine_lists: list[list[str]] = []
    info = _unread_step(shared_env, engine_lists)
    lazy = info["admissible_actions"]
    plain = list(engine_lists[0])
    assert plain and plain[0] != "look around" and "look around" in plain
    expected = LIST_USES[use](plain, {**info, "admissible_actions": list(plain), "plain": list(engine_lists[0])})
    got = LIST_USES[use](lazy, {**info, "plain": list(engine_lists[0])})
    assert got == expected and type(got) is type(expected), use
    assert lazy.computed
    if isinstance(got, list):  # results are plain lists, never lazy ones
        assert type(got) is list


def test_lazy_lists_compare_by_contents_and_state(shared_env):
    shared_env.reset(options={"task_id": "4-2:0"})
    engine_lists: list[list[str]] = []
    first = _unread_step(shared_env, engine_lists)["admissible_actions"]
    assert len(first) > 100  # read it before the next step
    second = _unread_step(shared_env, engine_lists)["admissible_actions"]
    assert engine_lists[0] == engine_lists[1]  # "look around" twice leaves the world as it was
    # different states: compared by contents (which reads the second one)
    assert first.state != second.state and not second.computed
    assert first == second and not first != second and second.computed and first is not second
    # a changed list no longer claims its state's contents
    shared_env.reset(options={"task_id": "4-2:0"})
    left = _unread_step(shared_env, engine_lists)["admissible_actions"]
    shared_env.reset(options={"task_id": "4-2:0"})
    right = _unread_step(shared_env, engine_lists)["admissible_actions"]
    assert left.state == right.state and left == right and not right.computed  # same state: no engine call
    right.append("fly")
    assert left != right and right[-1] == "fly" and right[:-1] == engine_lists[-1]
    assert json.loads(json.dumps(right)) == engine_lists[-1] + ["fly"]
    with pytest.raises(TypeError):
        hash(left)


def test_lazy_lists_cost_nothing_until_read(shared_env, monkeypatch):
    shared_env.reset(options={"task_id": "4-2:0"})
    engine = shared_env.unwrapped.engine
    calls = []
    real = engine.valid_actions
    monkeypatch.setattr(engine, "valid_actions", lambda **kwargs: calls.append(kwargs) or real(**kwargs))
    infos = [shared_env.step(action)[4] for action in ["look around", "inventory", "look around"]]
    assert calls == [] and not any(info["admissible_actions"].computed for info in infos)
    actions = infos[-1]["admissible_actions"]
    assert json.loads(json.dumps(infos[-1]))["admissible_actions"] == actions == list(actions) + [] == actions[:]
    assert calls == [{"keep_random_state": True}]  # one engine call, however often the list is read


def test_a_list_stays_readable_when_the_episode_replays_its_state(shared_env):
    """gymnasium's check_env compares the infos of two identical episodes after both ran."""
    shared_env.reset(options={"task_id": "4-2:0"})
    before = shared_env.step("open door to hallway")[4]["admissible_actions"]
    shared_env.reset(options={"task_id": "4-2:0"})
    after = shared_env.step("open door to hallway")[4]["admissible_actions"]
    assert len(before) == len(after) and list(before) == list(after)  # `before` is read only now
    shared_env.step("look around")
    shared_env.reset(options={"task_id": "4-2:0"})
    other = shared_env.step("inventory")[4]["admissible_actions"]
    shared_env.step("look around")
    with pytest.raises(StaleAdmissibleActionsError):
        list(other)


def test_vector_envs_receive_the_lazy_lists_as_plain_lists():
    from functools import partial

    from gymnasium.vector import AutoresetMode

    from envrl.processes import start_method

    factory = partial(ScienceWorldEnv, task="find-plant")
    vec = gym.vector.AsyncVectorEnv(
        [factory, factory], shared_memory=False, context=start_method(), autoreset_mode=AutoresetMode.SAME_STEP
    )
    try:
        observations, info = vec.reset(seed=0)
        assert all(type(actions) is list and "look around" in actions for actions in info["admissible_actions"])
        observations, _, _, _, info = vec.step(("look around", "inventory"))
        assert observations[1].startswith("In your inventory") and list(info["valid_action"]) == [True, True]
    finally:
        vec.close()


def test_eager_admissible_actions_equal_lazy_ones():
    env = gym.make(ENV_ID, task="find-animal", admissible="eager")
    try:
        runs = []
        for mode in ("eager", "lazy"):
            env.unwrapped.admissible = mode  # one JVM for both runs
            observation, info = env.reset(options={"task_id": "4-4:3"})
            lists = [info["admissible_actions"]]
            for action in ["open door to kitchen", "go to kitchen"]:
                lists.append(list(lists[-1]))  # read each list before the next step
                lists.append(env.step(action)[4]["admissible_actions"])
            assert type(lists[-1]) is (list if mode == "eager" else LazyAdmissibleActions)
            runs.append([list(actions) for actions in lists])
        _STARTED_JVMS.append(env.unwrapped.engine.pid)
    finally:
        env.close()
    assert runs[0] == runs[1] and len(runs[0][0]) > 100


# ---- determinism and the stock engine -------------------------------------------------------

_REPLAY = textwrap.dedent("""
    import json, sys
    from envrl.envs.scienceworld.env import ScienceWorldEnv
    task_id, split, read, warmup = sys.argv[1], sys.argv[2], sys.argv[3] == "read", sys.argv[4]
    env = ScienceWorldEnv(task=["5-2", "4-4"], split=split, simplifications=None, expert_plan=True)
    if warmup != "-":  # another episode first: the history must not matter
        env.reset(options={"task_id": warmup})
        for action in ["look around", "open door to kitchen", "wait"]:
            env.step(action)
    observation, info = env.reset(options={"task_id": task_id})
    plan = list(info["expert_plan"])
    trace = [[observation, info["raw_score"]]]
    for index, action in enumerate([*plan, "wait", "look around"]):
        if read and index % 2:
            len(info["admissible_actions"])  # reading must not change the world
        observation, reward, terminated, truncated, info = env.step(action)
        trace.append([observation, reward, terminated, info["raw_score"], info["valid_action"]])
    env.close()
    print(json.dumps({"plan": plan, "trace": trace}))
""")


def _replay(task_id: str, split: str, read: bool, warmup: str = "-") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _REPLAY, task_id, split, "read" if read else "skip", warmup],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # ~15 s: two JVMs play a 20+ step gold path
def test_same_task_and_actions_give_the_same_observations_in_any_process():
    # grow-fruit: bees fly at random and pollinate; this variation's gold path only works
    # with the stock env's random draws (see envrl.envs.scienceworld.env)
    task_id = "5-2:78"
    first, second = _replay(task_id, "dev", read=False), _replay(task_id, "dev", read=True, warmup="4-4:160")
    outputs = [json.loads(p.communicate(timeout=300)[0]) for p in (first, second)]
    assert outputs[0]["plan"] == outputs[1]["plan"] and len(outputs[0]["plan"]) > 20
    assert outputs[0]["trace"] == outputs[1]["trace"]
    assert max(step[3] for step in outputs[0]["trace"][1:]) == 100  # the gold path completed the task


_EVERY_TASK = textwrap.dedent("""
    import json, sys
    from envrl.envs.scienceworld.env import ScienceWorldEnv
    from envrl.envs.scienceworld.tasks import all_tasks, split_variations
    order = [t for t in all_tasks()]
    if sys.argv[1] == "reversed":  # another history before each task: it must not matter
        order.reverse()
    env = ScienceWorldEnv(task=None, split="dev", simplifications=None, expert_plan=True, java_heap="512m")
    traces = {}
    for task in order:
        task_id = f"{task.id}:{split_variations(task.name, 'dev')[0]}"
        observation, info = env.reset(options={"task_id": task_id})
        trace = [observation, info["raw_score"], sorted(info["admissible_actions"])]
        for action in ["look around", *info["expert_plan"][:12], "inventory"]:
            observation, reward, terminated, truncated, info = env.step(action)
            trace.append([observation, reward, terminated, info["raw_score"]])
        traces[task_id] = trace
    env.close()
    print(json.dumps(traces))
""")


@pytest.mark.slow
def test_every_task_is_deterministic_across_processes_and_histories():
    """All 30 tasks, in two processes that play them in opposite orders: the same traces."""
    runs = [
        subprocess.Popen([sys.executable, "-c", _EVERY_TASK, order], stdout=subprocess.PIPE, text=True)
        for order in ("forward", "reversed")
    ]
    forward, backward = [json.loads(p.communicate(timeout=900)[0]) for p in runs]
    assert len(forward) == 30 and forward.keys() == backward.keys()
    assert [t for t in forward if forward[t] != backward[t]] == []


def test_deterministic_false_runs_the_jvm_as_stock_does():
    """``deterministic=False``: no fixed identity hash codes (stock's behaviour), and it still plays."""
    from envrl.envs.scienceworld.engine import DETERMINISTIC_JAVA_OPTIONS

    agent = make_agent("expert")
    env = gym.make(ENV_ID, task="4-2", split="dev", deterministic=False, **agent.env_kwargs)
    try:
        info = _play(env, agent, "4-2:150")
        with open(f"/proc/{env.unwrapped.engine.pid}/cmdline", "rb") as handle:
            arguments = handle.read().decode().split("\0")
        _STARTED_JVMS.append(env.unwrapped.engine.pid)
    finally:
        env.close()
    assert info["success"] and not set(DETERMINISTIC_JAVA_OPTIONS) & set(arguments)
    deterministic = gym.make(ENV_ID, task="4-2", split="dev")
    try:
        deterministic.reset(seed=0)
        with open(f"/proc/{deterministic.unwrapped.engine.pid}/cmdline", "rb") as handle:
            assert set(DETERMINISTIC_JAVA_OPTIONS) <= set(handle.read().decode().split("\0"))
        _STARTED_JVMS.append(deterministic.unwrapped.engine.pid)
    finally:
        deterministic.close()


def test_observations_equal_the_stock_engines_on_a_gold_path(monkeypatch):
    from scienceworld import ScienceWorldEnv as StockEnv

    # Stock gets the JVM options envrl uses: with Java's default identity hash codes the
    # stock engine is not reproducible itself (see envrl.envs.scienceworld.engine).
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xmx512m -XX:+UseSerialGC -XX:+UnlockExperimentalVMOptions -XX:hashCode=2")
    stock = StockEnv("", envStepLimit=10**6)
    try:
        stock.load("use-thermometer", 5, "", generateGoldPath=True)
        gold = stock.get_gold_action_sequence()
        observation, info = stock.reset()
        expected = [(observation, info["score"], False, info["valid"])]
        for action in ["fly away", *gold]:  # up to the end: envrl's episodes end there (base.py)
            observation, _, done, info = stock.step(action)
            expected.append((observation, info["score"], done, info["valid"]))
            if done:
                break
    finally:
        stock.close()
    assert expected[-1][1] == 100
    env = gym.make(ENV_ID, task="use-thermometer", simplifications=None, expert_plan=True)
    try:
        observation, info = env.reset(options={"task_id": "2-1:5"})
        assert info["expert_plan"] == gold
        got = [(observation, info["raw_score"], False, list(info["admissible_actions"]))]
        for action in ["fly away", *gold]:
            observation, _, terminated, _, info = env.step(action)
            got.append((observation, info["raw_score"], terminated, list(info["admissible_actions"])))
            if terminated:
                break
    finally:
        env.close()
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    # In a world without random movers the lists match too (benchmarks/scienceworld_speed.py
    # compares admissible="eager", which equals stock everywhere).
    assert [g[3] for g in got] == [e[3] for e in expected]


# ---- JVM hygiene ---------------------------------------------------------------------------


def test_a_jvm_that_cannot_start_gives_a_clear_error():
    from envrl.envs.scienceworld import EngineStartError

    before = set(_child_jvms())
    env = gym.make(ENV_ID, task="find-plant", java_options=["-XX:+NoSuchOptionAnywhere"])
    with pytest.raises(EngineStartError, match="NoSuchOptionAnywhere"):
        env.reset(seed=0)
    assert env.unwrapped.engine is None and set(_child_jvms()) <= before
    env.close()


def test_close_stops_the_jvm():
    env = gym.make(ENV_ID, task="find-plant", java_heap="256m")
    env.reset(seed=0)
    engine = env.unwrapped.engine
    pid = engine.pid
    assert _jvm_running(pid)
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        assert b"-Xmx256m" in handle.read().split(b"\0")
    env.close()
    assert _wait_gone(pid, 5)
    env.close()  # idempotent


_ORPHAN = textwrap.dedent("""
    import sys, time
    from envrl.envs.scienceworld.env import ScienceWorldEnv
    env = ScienceWorldEnv(task="find-plant")
    env.reset(seed=0)
    print(env.engine.pid, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(120)
""")


@pytest.mark.parametrize("ending", ["exit", "kill"])
def test_no_jvm_survives_its_python_process(ending):
    child = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN, "exit" if ending == "exit" else "wait"], stdout=subprocess.PIPE, text=True
    )
    try:
        pid = int(child.stdout.readline())
        if ending == "kill":
            assert _jvm_running(pid)
            child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        assert _wait_gone(pid, 10), f"JVM {pid} outlived its Python process ({ending})"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_neither_breaks_nor_keeps_the_parents_jvm():
    import gc

    env = gym.make(ENV_ID, task="find-plant")
    env.reset(options={"task_id": "4-3:0"})
    pid = env.unwrapped.engine.pid
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child drops everything it inherited, then lingers
        try:
            del env
            gc.collect()
            os.write(write_end, b"x")
            time.sleep(30)
        finally:
            os._exit(0)
    try:
        assert os.read(read_end, 1) == b"x"
        assert env.step("open door to kitchen")[4]["valid_action"]  # the parent's connection still works
        env.close()
        assert _wait_gone(pid, 5), "the forked child kept the JVM alive"
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(read_end)
        os.close(write_end)


def test_a_killed_jvm_gives_a_clear_error_and_reset_recovers():
    env = gym.make(ENV_ID, task="find-plant")
    try:
        env.reset(options={"task_id": "4-3:0"})
        pid = env.unwrapped.engine.pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineDiedError, match=r"killed by SIGKILL during step\('open door to kitchen'\)") as caught:
            env.step("open door to kitchen")
        assert isinstance(caught.value, RuntimeError) and "reset() starts a new JVM" in str(caught.value)
        assert caught.value.__cause__ is None and caught.value.__suppress_context__
        observation, info = env.reset(options={"task_id": "4-3:0"})
        assert observation.startswith("This room is called") and env.unwrapped.engine.pid != pid
        assert env.step("open door to kitchen")[4]["valid_action"]
        _STARTED_JVMS.append(env.unwrapped.engine.pid)
    finally:
        env.close()
    assert _wait_gone(pid, 5)


def test_no_java_process_left_behind(shared_env):
    # runs last in this module: after closing the shared env, every JVM a test here started is gone
    shared_env.close()
    assert [pid for pid in _STARTED_JVMS if not _wait_gone(pid, 5)] == []
    assert _child_jvms() == []
