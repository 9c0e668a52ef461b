"""Prompt templates, the action parser and the LLM agent's turn logic (without a model)."""

from __future__ import annotations

import json
import time

import pytest

from envrl.agents.generation import Generation, SamplingConfig
from envrl.agents.llm import LLMAgent, LLMOptions, SharedBackend, act_together
from envrl.agents.prompts import (
    BUILTIN_TEMPLATES,
    MAX_ACTION_CHARS,
    MAX_OBSERVATION_CHARS,
    PromptTemplate,
    TemplateError,
    Turn,
    load_template,
    parse_response,
)

# ---- templates -----------------------------------------------------------------------------


def test_think_action_prompt_is_exactly_the_template_filled_in():
    template = load_template("think-action")
    history = [
        Turn("You arrive at drawer 1.", "open drawer 1", "look inside"),
        Turn("You open the drawer 1. It is empty.", "go to shelf 1"),
    ]
    messages = template.build_messages(
        "alfworld",
        "put a mug on the shelf.",
        "You arrive at shelf 1.",
        ["take mug 1 from shelf 1", "look"],
        history,
        turn=5,
    )
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == template.system
    assert messages[1]["content"] == (
        template.env_intro["alfworld"] + "\n\n"
        "Your task: put a mug on the shelf.\n\n"
        "Your last 2 turns, oldest first:\n"
        "[turn 3] Observation: You arrive at drawer 1.\n"
        "[turn 3] Action: open drawer 1\n"
        "[turn 4] Observation: You open the drawer 1. It is empty.\n"
        "[turn 4] Action: go to shelf 1\n"
        "\n"
        "Current observation (turn 5):\nYou arrive at shelf 1.\n\n"
        "Admissible actions (2):\n- take mug 1 from shelf 1\n- look\n\n"
        "Think step by step about the situation inside <think> </think>, then give exactly one action inside "
        "<action> </action>, for example: <think>...</think><action>go to cabinet 1</action>"
    )


def test_compact_prompt_has_no_admissible_list_and_no_format_instruction():
    template = load_template("compact")
    messages = template.build_messages(
        "textworld",
        "take the key.",
        "-= Attic =-\nThere is a key.",
        ["take key", "go east"],
        [Turn("Welcome.", "go west")],
        turn=2,
    )
    assert messages == [
        {"role": "system", "content": "Play the text game: one action per turn."},
        {"role": "user", "content": "Task: take the key.\n\nWelcome.\n> go west\n\n-= Attic =-\nThere is a key."},
    ]
    assert template.format_response("take key") == "<action>take key</action>"


def test_react_history_carries_the_models_own_thoughts():
    template = load_template("react")
    messages = template.build_messages(
        "webshop", "buy socks", "page", [], [Turn("start", "search[socks]", "find socks")], turn=2
    )
    user = messages[1]["content"]
    assert "Observation 1: start\nThought 1: find socks\nAction 1: search[socks]\n" in user
    assert "Admissible actions" not in user  # no list when the env gives none
    assert "<action>search[red running shoes]</action>" in user


def test_first_turn_has_no_history_and_unknown_envs_get_the_default_intro():
    template = load_template()
    user = template.build_messages("some-plugin-env", "win", "obs", ["a"], [], turn=1)[1]["content"]
    assert user.startswith(template.env_intro["default"] + "\n\nYour task: win\n\nCurrent observation (turn 1)")


def test_long_admissible_lists_and_observations_are_capped():
    template = load_template()
    actions = [f"action {i}" for i in range(250)]
    user = template.build_messages("scienceworld", "t", "x" * (MAX_OBSERVATION_CHARS + 500), actions, [], 1)[1][
        "content"
    ]
    assert "Admissible actions (250):\n" in user
    assert "- action 99\n- ... and 150 more\n" in user and "- action 100\n" not in user
    assert "[...] " + "x" * MAX_OBSERVATION_CHARS + "\n" in user and "x" * (MAX_OBSERVATION_CHARS + 1) not in user


def test_braces_in_observations_are_inserted_verbatim():
    template = load_template()
    user = template.build_messages("textworld", "{instruction}", "a {weird} {0} obs }{", ["{x}"], [], 1)[1]["content"]
    assert "Your task: {instruction}" in user and "a {weird} {0} obs }{" in user and "- {x}\n" in user


def test_custom_template_files_and_their_errors(tmp_path):
    data = load_template("think-action").to_dict()
    data["name"] = "mine"
    data["user"] = "Task: {instruction}\nNow: {observation}\n{admissible}Answer with <think></think><action></action>"
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    mine = load_template(path)
    assert mine.name == "mine" and mine.sha256 != load_template("think-action").sha256
    assert mine.build_messages("alfworld", "t", "o", [], [], 1)[1]["content"].startswith("Task: t\nNow: o\n")

    data["user"] = "Task: {instructions}"  # misspelt field
    path.write_text(json.dumps(data))
    with pytest.raises(TemplateError, match="user uses an unknown or malformed field"):
        load_template(path)
    del data["user"]
    path.write_text(json.dumps(data))
    with pytest.raises(TemplateError, match="lacks user"):
        load_template(path)
    path.write_text("{not json")
    with pytest.raises(TemplateError, match="not valid JSON"):
        load_template(path)
    with pytest.raises(TemplateError, match="unknown prompt template 'nope'"):
        load_template("nope")


def test_builtin_templates_round_trip_through_dicts():
    for name in BUILTIN_TEMPLATES:
        template = load_template(name)
        assert PromptTemplate.from_dict(template.to_dict()) == template


# ---- the parser ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, action, think, problem",
    [
        ("<think>go there</think><action>go to shelf 1</action>", "go to shelf 1", "go there", None),
        ("<THINK> a </THINK>\n<Action>\n  take  mug 1\n from shelf 1 </Action>", "take mug 1 from shelf 1", "a", None),
        ("<think>x</think> text after <action>look</action> trailing words", "look", "x", None),
        ("go to shelf 1", None, None, "no <action> tag"),
        ("<think>x</think>", None, "x", "no <action> tag"),
        ("<think>x</think><action>a</action><action>b</action>", None, "x", "2 <action> tags"),
        ("<think>x</think><action>look", None, "x", "unclosed <action>"),
        ("<think>x</think><action>   </action>", None, "x", "empty <action>"),
        ("<action>look</action><think>x</think>", None, "x", "<think> after <action>"),
        ("<action>look</action>", None, None, "no <think> tag"),
        ("<think>a</think><think>b</think><action>look</action>", None, "a", "2 <think> tags"),
        ("<think>a <action>look</action></think>", None, "a <action>look</action>", "<action> inside <think>"),
        ("<think>x</think></action><action>look</action>", None, "x", "</action> without <action>"),
        ("", None, None, "no <action> tag"),
    ],
)
def test_parse_response(text, action, think, problem):
    parsed = parse_response(text)
    assert (parsed.action, parsed.think, parsed.problem) == (action, think, problem)
    assert parsed.format_valid is (action is not None)


def test_parse_without_required_reasoning_and_overlong_actions():
    assert parse_response("<action>look</action>", require_think=False).action == "look"
    long_action = "<think>x</think><action>" + "a" * (MAX_ACTION_CHARS + 1) + "</action>"
    assert parse_response(long_action).problem == f"action longer than {MAX_ACTION_CHARS} characters"


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ('<tool_call>{"name": "act", "arguments": {"action": "go  north"}}</tool_call>', "go north"),
        ('<tool_call>\n{"name": "search", "arguments": {"query": "red shoes"}}\n</tool_call>', "search[red shoes]"),
        ('<tool_call>{"name": "click", "arguments": {"target": "buy now"}}</tool_call><|im_end|>', "click[buy now]"),
        ('<tool_call>{"name": "act", "arguments": {"action": "look"}}</tool_call>' * 2, None),  # two calls
        ('<tool_call>{"name": "act", "arguments": {"action": 3}}</tool_call>', None),  # not text
        ('<tool_call>{"name": "jump", "arguments": {"action": "up"}}</tool_call>', None),  # not an envrl tool
        ('<tool_call>{"name": "act", "arguments": </tool_call>', None),  # broken JSON
    ],
)
def test_a_tool_call_is_read_as_its_action_where_no_reasoning_is_required(text, action):
    parsed = parse_response(text, require_think=False)
    assert parsed.action == action and parsed.format_valid is (action is not None)
    assert parse_response(text).action is None  # the think-action format still needs its tags
    # an <action> tag wins over a tool call
    assert parse_response("<action>look</action>" + text, require_think=False).action == "look"


def test_huge_responses_parse_quickly_and_are_counted_invalid_without_an_action():
    huge = "<think>" + "blah " * 400_000 + "</think><action>look</action>"  # 2 MB, action past the cut
    start = time.perf_counter()
    parsed = parse_response(huge)
    assert time.perf_counter() - start < 0.5
    assert not parsed.format_valid and parsed.action is None and parsed.problem == "unclosed <think>"


# ---- the agent's turns, with a scripted back end -------------------------------------------


class ScriptedBackend:
    """Answers each prompt with the next scripted response and remembers what it was asked."""

    model = "scripted"

    def __init__(self, responses):
        self.responses = list(responses)
        self.calls = []

    def generate(self, prompts, sampling, seeds=None):
        self.calls.append((list(prompts), sampling, seeds))
        out = []
        for _ in prompts:
            text = self.responses.pop(0)
            if text is None:
                out.append(Generation(text="", finish_reason="error", attempts=5, error="HTTP 500 after 5 attempts"))
            else:
                out.append(Generation(text=text, prompt_tokens=10, completion_tokens=3))
        return out

    def protocol(self):
        return {"backend": "scripted"}

    def close(self):
        self.closed = True


def _agent(backend, **options):
    shared = SharedBackend(lambda: backend, {"backend": "scripted"})
    return LLMAgent("scripted", "alfworld", shared, LLMOptions.from_mapping(options))


def test_agent_turns_history_window_and_counts():
    backend = ScriptedBackend(
        [
            "<think>a</think><action>go to shelf 1</action>",
            "no tags at all",
            None,
            "<think>d</think><action>look</action>",
        ]
    )
    agent = _agent(backend, history=1)
    agent.reset(seed=3)
    info = {"instruction": "put a mug on the shelf.", "admissible_actions": ["look"]}
    assert agent.act("obs 1", info) == "go to shelf 1"
    assert agent.step_info["format_valid"] and agent.step_info["think"] == "a"
    assert agent.act("obs 2", info) == ""  # format-invalid: the empty action
    assert agent.step_info["format_problem"] == "no <action> tag" and agent.step_info["response"] == "no tags at all"
    assert agent.act("obs 3", info) == ""  # the server failed after its retries
    assert agent.step_info["error"] == "HTTP 500 after 5 attempts" and agent.step_info["attempts"] == 5
    assert agent.act("obs 4", info) == "look"
    last_prompt = backend.calls[-1][0][0][1]["content"]
    assert "Your last 1 turns" in last_prompt and "[turn 3] Observation: obs 3\n[turn 3] Action: \n" in last_prompt
    assert "obs 2" not in last_prompt  # outside the window of 1
    assert agent.episode_stats() == {
        "responses": 4,
        "format_invalid": 2,
        "failed_requests": 1,
        "prompt_tokens": 30,
        "completion_tokens": 9,
    }
    agent.reset(seed=4)
    assert agent.episode_stats()["responses"] == 0


def test_siblings_share_one_backend_and_one_generate_call_per_turn():
    backend = ScriptedBackend([f"<think>t</think><action>act {i}</action>" for i in range(3)])
    first = _agent(backend)
    agents = [first, first.sibling(), first.sibling()]
    for agent in agents:
        agent.reset(seed=0)
    actions = act_together(agents, ["o0", "o1", "o2"], [{"instruction": "i"}] * 3)
    assert actions == ["act 0", "act 1", "act 2"]
    assert len(backend.calls) == 1 and len(backend.calls[0][0]) == 3
    assert backend.calls[0][1] == SamplingConfig() and backend.calls[0][2] is None  # greedy: as given
    agents[1].close()  # a sibling does not close the shared back end
    assert not hasattr(backend, "closed")
    first.close()
    assert backend.closed


def test_sampled_turns_get_seeds_from_the_episode_and_turn():
    backend = ScriptedBackend(["<think>t</think><action>a</action>"] * 2)
    agent = _agent(backend, temperature=0.7)
    agent.reset(seed=5)
    agent.act("o", {})
    agent.act("o", {})
    expected = [(5 * 1_000_003 + 1) % 2**31, (5 * 1_000_003 + 2) % 2**31]
    assert [call[2] for call in backend.calls] == [[expected[0]], [expected[1]]]  # one seed per prompt
    assert [call[1].seed for call in backend.calls] == expected  # and for back ends that seed a whole call
    assert all(call[1].temperature == 0.7 for call in backend.calls)


def test_protocol_records_template_sampling_and_backend():
    agent = _agent(ScriptedBackend([]), template="react", history=3, temperature=0.5, max_new_tokens=64)
    protocol = agent.protocol()
    assert protocol["template"] == "react" and protocol["template_sha256"] == load_template("react").sha256
    assert protocol["history"] == 3
    assert protocol["sampling"] == {"temperature": 0.5, "top_p": 1.0, "max_new_tokens": 64, "seed": None}
    assert protocol["backend"] == {"backend": "scripted"}


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="history"):
        LLMOptions.from_mapping({"history": -1})
    with pytest.raises(ValueError, match="temperature"):
        LLMOptions.from_mapping({"temperature": -0.1})
    from envrl.agents import make_agent

    with pytest.raises(ValueError, match="takes no options"):
        make_agent("random", "alfworld", options={"temperature": 0.5})
    with pytest.raises(ValueError, match="needs a model"):
        make_agent("hf:", "alfworld")
