"""World-model probes (``envrl probe``): the measures, the store's probes table, the leaderboard
columns (text, Markdown, JSON, web page) and the command end to end on TextWorld."""

from __future__ import annotations

import argparse
import json
import sqlite3
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from envrl.agents.prompts import Turn, load_template
from envrl.evaluation import EpisodeRecord, ResultStore, StepRecord, leaderboard, leaderboard_data
from envrl.evaluation.store import ProbeRecord
from envrl.training import probes
from envrl.training.dynamics import load_world_model_template
from envrl.training.probes import Transition

ID_TEMPLATE = load_world_model_template("inverse-dynamics")
POLICY_TEMPLATE = load_template("action")


def transition(action: str, admissible: list[str], **fields: Any) -> Transition:
    values: dict[str, Any] = {
        "episode": 0,
        "step": 0,
        "task_id": "t0",
        "instruction": "find the key",
        "history": (),
        "observation": f"before {action}",
        "next_observation": f"after {action}",
    }
    values.update(fields)
    return Transition(action=action, admissible_actions=tuple(admissible), **values)


#: candidates 2, 3 (a repeat dropped), 3 (the true action added): chance (1/2 + 1/3 + 1/3) / 3
HAND_MADE = [
    transition("go south", ["go north", "go south"]),
    transition("open door", ["take key", "Take  Key", "open door", "look"], step=1),
    transition("search[red shoes]", ["search[<query>]", "click[back]"], step=2),
]
HAND_MADE_CHANCE = (1 / 2 + 1 / 3 + 1 / 3) / 3


# ---- inverse dynamics ------------------------------------------------------------------------


def test_id_candidates_drop_repeats_and_add_the_true_action():
    assert [probes.id_candidates(t) for t in HAND_MADE] == [
        (["go north", "go south"], 1),
        (["take key", "open door", "look"], 1),
        (["search[<query>]", "click[back]", "search[red shoes]"], 2),
    ]


def oracle_for(transitions: list[Transition], history: int):
    """A scorer that knows each prompt's true action: 1 for its response, 0 for the others."""
    truth = {
        ID_TEMPLATE.inverse_dynamics_messages(
            t.instruction, t.history, t.observation, t.next_observation, history=history
        )[1]["content"]: POLICY_TEMPLATE.format_response(t.action)
        for t in transitions
    }

    def score(messages, responses):
        return [1.0 if r == truth[messages[1]["content"]] else 0.0 for r in responses]

    return score


def test_id_accuracy_is_one_for_an_oracle_and_chance_for_a_uniform_scorer():
    def run(scorer):
        return probes.inverse_dynamics_probe(HAND_MADE, ID_TEMPLATE, POLICY_TEMPLATE, scorer, history=2)

    oracle = run(oracle_for(HAND_MADE, 2))
    assert (oracle.accuracy, oracle.count) == (1.0, 3)
    assert oracle.chance == pytest.approx(HAND_MADE_CHANCE)
    uniform = run(lambda messages, responses: [0.0] * len(responses))
    assert uniform.accuracy == pytest.approx(HAND_MADE_CHANCE)  # ties share the credit
    assert uniform.chance == pytest.approx(HAND_MADE_CHANCE)
    inverted = oracle_for(HAND_MADE, 2)
    assert run(lambda m, r: [-v for v in inverted(m, r)]).accuracy == 0.0
    # two of three tied for the best, the truth among them: half a hit
    half = run(lambda m, r: [1.0, 1.0] if len(r) == 2 else [-v for v in inverted(m, r)])
    assert half.accuracy == pytest.approx((0.5 + 0 + 0) / 3)
    assert probes.inverse_dynamics_probe([], ID_TEMPLATE, POLICY_TEMPLATE, inverted, history=2).accuracy is None
    with pytest.raises(ValueError, match="2 scores for 3 candidates"):
        run(lambda messages, responses: [0.0, 0.0])


def test_the_scorer_sees_the_inverse_dynamics_prompt_and_policy_responses():
    history = (Turn(observation="first room", action="look"), Turn(observation="second room", action="go east"))
    seen = []

    def record(messages, responses):
        seen.append((messages, list(responses)))
        return [0.0] * len(responses)

    t = transition("go south", ["go north", "go south"], history=history)
    probes.inverse_dynamics_probe([t], ID_TEMPLATE, POLICY_TEMPLATE, record, history=1)
    [(messages, responses)] = seen
    assert messages[1]["content"] == (
        "Task: find the key\n\nsecond room\n> go east\n\nBefore:\nbefore go south\n\nAfter:\nafter go south"
    )
    assert responses == ["<action>go north</action>", "<action>go south</action>"]


def test_a_follow_up_template_continues_the_policys_own_prompt_at_the_state():
    seen = []

    def record(messages, responses):
        seen.append(messages)
        return [0.0] * len(responses)

    history = (Turn(observation="first room", action="look"), Turn(observation="second room", action="go east"))
    t = transition("go south", ["go north", "go south"], history=history, step=2)
    template = load_world_model_template("follow-up-inverse-dynamics")
    probes.inverse_dynamics_probe([t], template, POLICY_TEMPLATE, record, history=1, env_name="textworld")
    policy_prompt = POLICY_TEMPLATE.build_messages(
        "textworld", "find the key", "before go south", ["go north", "go south"], list(history[-1:]), 3
    )
    assert seen == [
        [
            *policy_prompt,
            {"role": "assistant", "content": "<action>?</action>"},
            {"role": "user", "content": "after go south\n\nWhich action is the '?'?"},
        ]
    ]


# ---- state prediction --------------------------------------------------------------------------


def test_exact_match_normalises_whitespace_only():
    assert probes.normalise_whitespace("\t-= Den =-\n\n  You see  a key. \n") == "-= Den =- You see a key."
    assert probes.exact_match("You see\na  key.  ", "You see a key.")
    assert probes.exact_match("", " \n ")
    assert not probes.exact_match("you see a key.", "You see a key.")  # case counts
    assert not probes.exact_match("You see a key", "You see a key.")  # so does punctuation
    assert not probes.exact_match("Yousee a key.", "You see a key.")


def test_fit_prompt_drops_the_start_only_when_it_must():
    assert probes.fit_prompt([1, 2, 3, 4], 2, None) == [1, 2, 3, 4]
    assert probes.fit_prompt([1, 2, 3, 4], 2, 6) == [1, 2, 3, 4]
    assert probes.fit_prompt([1, 2, 3, 4], 3, 6) == [2, 3, 4]
    assert probes.fit_prompt([1, 2, 3, 4], 9, 6) == [4]  # one prompt token stays


def test_teacher_forced_hits_on_a_model_whose_predictions_are_known():
    torch = pytest.importorskip("torch")
    from envrl.training.dynamics import TargetSample

    vocab = 16

    class NextToken(torch.nn.Module):
        """Predicts token x + 1 after token x, whatever came before."""

        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask):
            logits = torch.nn.functional.one_hot((input_ids + 1) % vocab, vocab).float()
            return argparse.Namespace(logits=logits)

    samples = [
        TargetSample([1, 2, 3], [4, 5, 7, 8], "state_prediction"),  # after 5 comes 6, not 7: 3 of 4
        TargetSample([10], [11, 13], "state_prediction"),  # 1 of 2, padded in a batch of two
        TargetSample([6, 7, 8, 9, 10, 11], [12], "state_prediction"),
    ]
    for batch_size in (1, 2, 3):
        assert probes.teacher_forced_hits(NextToken(), samples, 15, batch_size=batch_size) == [3, 1, 1]


def test_the_sp_probe_asks_a_follow_up_of_the_policys_prompt(tiny_checkpoint):
    torch = pytest.importorskip("torch")
    from envrl.training.config import PolicyConfig
    from envrl.training.policy import Policy

    policy = Policy(PolicyConfig(model=str(tiny_checkpoint), template="action", history=1, device="cpu"), "textworld")
    template = load_world_model_template("follow-up-state-prediction")
    transitions = HAND_MADE[:2]
    accuracy, exact, truncated = probes.state_prediction_probe(policy, transitions, template, batch_size=2)
    hits = total = 0
    for t in transitions:
        messages = POLICY_TEMPLATE.messages_at(
            "textworld", t.instruction, t.observation, t.admissible_actions, t.history, 1
        )
        messages += [
            {"role": "assistant", "content": POLICY_TEMPLATE.format_response(t.action)},
            {"role": "user", "content": "What does the environment show next?"},
        ]
        prompt, target = policy.encode_prompt(messages), policy.encode_response(t.next_observation)
        with torch.no_grad():
            logits = policy.unwrapped(input_ids=torch.tensor([prompt + target])).logits[0]
        predicted = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
        hits += sum(p == y for p, y in zip(predicted, target))
        total += len(target)
    assert accuracy == pytest.approx(hits / total) and (exact, truncated) == (0.0, 0)


def test_teacher_forced_hits_of_the_tiny_model_match_a_direct_computation(tiny_checkpoint):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from envrl.training.dynamics import TargetSample

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    samples = [
        TargetSample(
            torch.randint(1, 1000, (p,), generator=generator).tolist(),
            torch.randint(1, 1000, (r,), generator=generator).tolist(),
            "state_prediction",
        )
        for p, r in ((5, 7), (12, 3), (3, 1), (9, 9))
    ]
    direct = []
    with torch.inference_mode():
        for s in samples:  # one unpadded sequence at a time
            tokens = torch.tensor([s.prompt_ids + s.response_ids])
            predicted = model(input_ids=tokens).logits[0].argmax(-1)
            n = len(s.prompt_ids)
            direct.append(sum(int(predicted[n - 1 + j]) == s.response_ids[j] for j in range(len(s.response_ids))))
    # the tiny model's vocabulary: random ids give a mix of hits and misses only by chance, so also
    # make one sample the model's own greedy continuation, which it must predict every token of
    with torch.inference_mode():
        prompt = [5, 6, 7]
        own = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, 3:].tolist()
    samples.append(TargetSample(prompt, own, "state_prediction"))
    direct.append(len(own))
    assert probes.teacher_forced_hits(model, samples, 0, batch_size=3) == direct


# ---- the store ---------------------------------------------------------------------------------


def probe_record(agent: str = "agent-a", split: str = "valid", **fields: Any) -> ProbeRecord:
    values: dict[str, Any] = {
        "agent": agent,
        "env": "textworld",
        "split": split,
        "seed": 0,
        "episodes": 2,
        "transitions": 12,
        "sp_token_accuracy": 0.125,
        "sp_exact_match": 0.0,
        "id_accuracy": 0.5,
        "id_chance": 0.25,
        "sp_template": "world-model",
        "id_template": "inverse-dynamics",
        "policy_template": "action",
        "envrl_version": "0.1.0",
        "created_at": 100.0,
        "config": {"checkpoint": "ckpt", "history": 2},
    }
    values.update(fields)
    return ProbeRecord(**values)


def write_runs(runs_dir: Path, runs: list[tuple[str, str, int]], protocol: dict[str, Any] | None = None) -> None:
    """TextWorld runs of 4 episodes each: (agent, split, successes); successes take 4 turns, failures 10."""
    store = ResultStore(runs_dir)
    for agent, split, wins in runs:
        run_id = f"{agent}-{split}" + (f"-{protocol['template']}" if protocol else "")
        config = {
            "env": "textworld",
            "env_id": "envrl/TextWorld-v0",
            "split": split,
            "agent": agent,
            "episodes": 4,
            "seed": 0,
            "env_kwargs": {},
            "agent_protocol": protocol or {},
        }
        with store.open_run(run_id, config) as writer:
            for i in range(4):
                writer.append(
                    EpisodeRecord(
                        run_id=run_id,
                        episode_index=i,
                        env_id="envrl/TextWorld-v0",
                        split=split,
                        task_id=f"t{i}",
                        task_type="custom",
                        seed=i,
                        agent=agent,
                        success=i < wins,
                        score=float(i < wins),
                        turns=4 if i < wins else 10,
                        valid_action_ratio=1.0,
                        wall_time=0.01,
                        trajectory=[StepRecord(action="look", observation="o", reward=0.0, valid=True)],
                        initial_observation="start",
                        finished_at=1.0 + i,
                    )
                )


def tables(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def test_probes_round_trip_and_the_same_probe_replaces_its_row(tmp_path):
    store = ResultStore(tmp_path)
    first = probe_record()
    probe_id = store.write_probe(first)
    assert probe_id == first.probe_id and probe_id.startswith("probe-textworld-valid-agent-a-s0-n2-")
    assert store.list_probes() == [first]

    again = probe_record(transitions=14, id_accuracy=0.75, created_at=200.0)  # same identity
    assert store.write_probe(again) == probe_id
    other_seed = probe_record(seed=1)
    store.write_probe(other_seed)
    assert store.list_probes() == [again, other_seed]

    # a name that only differs in what the id's slug drops still gets its own row
    twin = probe_record(agent="agent a")
    assert twin.probe_id != probe_record(agent="agent_a").probe_id
    store.write_probe(twin)
    store.write_probe(probe_record(agent="agent_a"))
    assert [p.agent for p in store.list_probes()] == ["agent a", "agent-a", "agent-a", "agent_a"]


def test_an_old_store_without_the_probes_table_still_reads(tmp_path):
    write_runs(tmp_path, [("agent-a", "valid", 3)])
    db = tmp_path / "envrl.sqlite"
    assert tables(db) == {"runs", "episodes"}  # run writers do not create the table
    store = ResultStore(tmp_path)
    assert store.list_probes() == []
    data = leaderboard_data(tmp_path, include_reported=False)
    assert data["probe_columns"] == [] and data["rows"][0]["probes"] == {}
    assert "SP acc" not in leaderboard(tmp_path, "text")
    assert tables(db) == {"runs", "episodes"}  # readers never create it either
    assert ResultStore(tmp_path / "none").list_probes() == []
    assert not (tmp_path / "none").exists()

    store.write_probe(probe_record())
    assert tables(db) == {"runs", "episodes", "probes"}
    assert [r["run_id"] for r in store.list_runs()] == ["agent-a-valid"]


def test_unreadable_probe_rows_are_skipped(tmp_path, caplog):
    store = ResultStore(tmp_path)
    store.write_probe(probe_record())
    store.write_probe(probe_record(agent="agent-b"))
    conn = sqlite3.connect(tmp_path / "envrl.sqlite")
    conn.execute("UPDATE probes SET id_accuracy = 'high' WHERE agent = 'agent-b'")
    conn.commit()
    conn.close()
    assert [p.agent for p in store.list_probes()] == ["agent-a"]
    assert "skipping probe probe-textworld-valid-agent-b" in caplog.text


# ---- the leaderboard ---------------------------------------------------------------------------


@pytest.fixture()
def probed_store(tmp_path) -> Path:
    """agent-a: runs on valid and test_ood, a probe on valid; agent-b: a run on valid, no probe;
    agent-c: a probe on valid and no run."""
    write_runs(tmp_path, [("agent-a", "valid", 3), ("agent-a", "test_ood", 1), ("agent-b", "valid", 2)])
    store = ResultStore(tmp_path)
    store.write_probe(probe_record())
    store.write_probe(probe_record(seed=1, transitions=5, sp_token_accuracy=0.9, created_at=300.0))  # fewer: not shown
    store.write_probe(
        probe_record(agent="agent-c", sp_token_accuracy=0.75, sp_exact_match=0.5, id_accuracy=1.0, id_chance=0.2)
    )
    return tmp_path


def test_leaderboard_text_shows_probe_columns_beside_success_and_turns(probed_store):
    text = leaderboard(probed_store, "text")
    table = text[text.index("== textworld ==") :].split("\n\n")[0]
    assert table.splitlines() == [
        "== textworld ==",
        "agent    valid (ID) success %  turns  turns (succ.)  SP acc  SP exact               ID acc  "
        "test_ood (OOD) success %  turns  turns (succ.)",
        "-------  --------------------  -----  -------------  ------  --------  -------------------  "
        "------------------------  -----  -------------",
        "agent-a  #1 75.0 [30.1, 95.4]    5.5            4.0    12.5       0.0   50.0 (chance 25.0)       "
        "#1 25.0 [4.6, 69.9]    8.5            4.0",
        "agent-b  #2 50.0 [15.0, 85.0]    7.0            4.0                                                "
        "                -      -              -",
        "agent-c                     -      -              -    75.0      50.0  100.0 (chance 20.0)                "
        "         -      -              -",
    ]
    assert "note: SP acc, SP exact, ID acc: world-model probes" in text
    # the other envs' tables (reported rows) have no probe and keep their columns
    headers = [section.splitlines()[1] for section in text.split("== ")[1:] if not section.startswith("textworld")]
    assert headers and all(h.rstrip().endswith("turns (succ.)") and "SP acc" not in h for h in headers)

    markdown = leaderboard(probed_store, "markdown").splitlines()
    assert (
        "| agent | valid (ID) success % | turns | turns (succ.) | SP acc | SP exact | ID acc | "
        "test_ood (OOD) success % | turns | turns (succ.) |"
    ) in markdown
    assert "| agent-b | #2 50.0 [15.0, 85.0] | 7.0 | 4.0 |  |  |  | - | - | - |" in markdown


def test_leaderboard_data_holds_each_rows_probes(probed_store):
    data = json.loads(leaderboard(probed_store, "json"))
    assert data["probe_columns"] == ["textworld/valid"]
    rows = {row["agent"]: row for row in data["rows"]}
    assert rows["agent-a"]["probes"]["textworld/valid"] == {
        "probe_id": probe_record().probe_id,
        "sp_token_accuracy": 0.125,
        "sp_exact_match": 0.0,
        "id_accuracy": 0.5,
        "id_chance": 0.25,
        "transitions": 12,
        "episodes": 2,
        "seed": 0,
        "sp_template": "world-model",
        "id_template": "inverse-dynamics",
        "policy_template": "action",
        "created_at": 100.0,
    }
    assert rows["agent-b"]["probes"] == {}
    assert rows["agent-c"]["cells"] == {} and rows["agent-c"]["probes"]["textworld/valid"]["id_accuracy"] == 1.0
    assert all(row["probes"] == {} for row in data["rows"] if row["source"] == "reported")


def test_a_probe_joins_every_setting_row_of_its_agent(tmp_path):
    write_runs(tmp_path, [("agent-a", "valid", 3)], {"template": "x"})
    write_runs(tmp_path, [("agent-a", "valid", 1)], {"template": "y"})
    ResultStore(tmp_path).write_probe(probe_record())
    rows = leaderboard_data(tmp_path, include_reported=False)["rows"]
    assert [(row["agent"], list(row["probes"])) for row in rows] == [
        ("agent-a (setting 1)", ["textworld/valid"]),
        ("agent-a (setting 2)", ["textworld/valid"]),
    ]


def test_the_web_page_shows_probe_columns(probed_store):
    pytest.importorskip("flask")
    bs4 = pytest.importorskip("bs4")
    from envrl.evaluation.web import create_app

    response = create_app(probed_store).test_client().get("/")
    assert response.status_code == 200
    table = bs4.BeautifulSoup(response.get_data(as_text=True), "html.parser").find("table", id="leaderboard")
    env_spans = {th.get_text(strip=True): int(th["colspan"]) for th in table.find_all("th", class_="env")}
    assert env_spans["textworld"] == 2 + 3  # two splits, three probe columns after valid
    assert [th.get_text(strip=True) for th in table.find_all("th", class_="probe")] == ["SP acc", "SP exact", "ID acc"]
    assert {th["data-column"] for th in table.find_all("th", class_="probe")} == {"textworld/valid"}
    width = 1 + sum(env_spans.values())
    assert {int(th["colspan"]) for th in table.find_all("tr", class_="section")[0].find_all("th")} == {width}

    def probe_cells(agent: str) -> list[str]:
        row = next(
            tr for tr in table.find_all("tr") if tr.find(class_="agent-name", string=lambda s: s and s.strip() == agent)
        )
        assert len(row.find_all(["th", "td"])) == width
        return [" ".join(td.get_text(" ").split()) for td in row.find_all("td", class_="probe")]

    assert probe_cells("agent-a") == ["12.5", "0.0", "50.0 chance 25.0"]
    assert probe_cells("agent-b") == ["", "", ""]
    assert probe_cells("agent-c") == ["75.0", "50.0", "100.0 chance 20.0"]
    metrics = [td["data-metric"] for td in table.find_all("td", class_="probe")[:3]]
    assert metrics == ["sp_token_accuracy", "sp_exact_match", "id_accuracy"]


def test_the_web_page_without_probes_has_no_probe_columns(tmp_path):
    pytest.importorskip("flask")
    bs4 = pytest.importorskip("bs4")
    from envrl.evaluation.web import create_app

    write_runs(tmp_path, [("agent-a", "valid", 3)])
    page = create_app(tmp_path).test_client().get("/").get_data(as_text=True)
    table = bs4.BeautifulSoup(page, "html.parser").find("table", id="leaderboard")
    assert table.find(class_="probe") is None
    assert "world-model probes" not in page


# ---- transitions and the command on TextWorld ---------------------------------------------------


def tw_settings(tw_cache: Path) -> dict[str, Any]:
    return {"cache_dir": str(tw_cache), "families": ["custom"]}


def test_transitions_are_the_experts_steps_and_repeat_for_a_seed(tw_cache):
    made = probes.collect_transitions("textworld", "valid", 1, env_kwargs=tw_settings(tw_cache))
    assert made == probes.collect_transitions("textworld", "valid", 1, env_kwargs=tw_settings(tw_cache))
    assert len(made) >= 2
    for k, t in enumerate(made):
        assert (t.episode, t.step) == (0, k)
        assert [turn.action for turn in t.history] == [earlier.action for earlier in made[:k]]
        assert t.action in t.admissible_actions  # TextWorld's expert acts from the list
        if k:
            assert t.observation == made[k - 1].next_observation
            assert t.history[-1].observation == made[k - 1].observation


@pytest.mark.parametrize("template", ["action", "think-action", "react", "FILE"])
def test_the_default_name_is_the_eval_label_of_the_checkpoint(template, tiny_checkpoint, tmp_path):
    from envrl.agents import make_agent

    if template == "FILE":  # a template file is named by its "name"
        data = json.loads(resources.files("envrl.agents").joinpath("templates").joinpath("action.json").read_text())
        template = str(tmp_path / "mine.json")
        Path(template).write_text(json.dumps({**data, "name": "mine"}))
    agent = make_agent(f"hf:{tiny_checkpoint}", "textworld", options={"template": template})  # loads no model
    assert probes.default_agent_name(tiny_checkpoint, template) == agent.name


def probe_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="envrl probe")
    probes.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_command_probes_the_tiny_model_end_to_end(tw_cache, tiny_checkpoint, tmp_path, capsys):
    pytest.importorskip("torch")
    from envrl.agents.generation import SamplingConfig
    from envrl.training.config import PolicyConfig
    from envrl.training.policy import Policy

    settings = tw_settings(tw_cache)
    argv = ["--checkpoint", str(tiny_checkpoint), "--env", "textworld", "--split", "valid", "--episodes", "1"]
    argv += ["--env-arg", f"cache_dir={tw_cache}", "--env-arg", 'families=["custom"]', "--history", "1"]
    argv += ["--runs-dir", str(tmp_path), "--device", "cpu"]
    assert probes.run(probe_args(*argv)) == 0
    [probe] = ResultStore(tmp_path).list_probes()
    agent = f"hf:{tiny_checkpoint}[action]"  # what `envrl eval --agent hf:DIR --template action` calls it
    assert (probe.agent, probe.env, probe.split, probe.seed, probe.episodes) == (agent, "textworld", "valid", 0, 1)
    assert (probe.sp_template, probe.id_template, probe.policy_template) == (
        "world-model",
        "inverse-dynamics",
        "action",
    )
    out = capsys.readouterr().out
    assert out.startswith(f"{agent} on textworld/valid: {probe.transitions} transitions of 1 episode(s); ")
    assert out.rstrip().endswith(f"recorded as {probe.probe_id}")

    # the figures, recomputed another way: ID through the hf back end's choose mode (mean score, greedy)
    transitions = probes.collect_transitions("textworld", "valid", 1, env_kwargs=settings)
    assert probe.transitions == len(transitions)
    assert probe.id_chance == pytest.approx(
        sum(1 / len(probes.id_candidates(t)[0]) for t in transitions) / len(transitions)
    )
    policy = Policy(PolicyConfig(model=str(tiny_checkpoint), template="action", history=1, device="cpu"), "textworld")
    id_template = load_world_model_template("inverse-dynamics")
    hits = 0
    for t in transitions:
        candidates, truth = probes.id_candidates(t)
        messages = id_template.inverse_dynamics_messages(
            t.instruction, t.history, t.observation, t.next_observation, history=1
        )
        responses = [POLICY_TEMPLATE.format_response(a) for a in candidates]
        [choice] = policy.backend.choose([messages], [responses], SamplingConfig(temperature=0.0), score="mean")
        hits += choice.choice == truth
    assert probe.id_accuracy == pytest.approx(hits / len(transitions))
    # a random model predicts almost no token of an observation, and writes none of them whole
    assert 0 <= probe.sp_token_accuracy < 0.2 and probe.sp_exact_match == 0.0

    assert agent in leaderboard(tmp_path, "text").split("== textworld ==")[1]


@pytest.mark.slow
def test_the_same_probe_again_gives_the_same_figures_and_replaces_its_row(tw_cache, tiny_checkpoint, tmp_path):
    argv = ["--checkpoint", str(tiny_checkpoint), "--env", "textworld", "--split", "valid", "--episodes", "1"]
    argv += ["--env-arg", f"cache_dir={tw_cache}", "--env-arg", 'families=["custom"]', "--history", "1"]
    argv += ["--runs-dir", str(tmp_path), "--device", "cpu"]
    assert probes.run(probe_args(*argv)) == 0
    [first] = ResultStore(tmp_path).list_probes()
    assert probes.run(probe_args(*argv, "--name", "mine")) == 0
    assert probes.run(probe_args(*argv)) == 0
    again, mine = ResultStore(tmp_path).list_probes()
    assert mine.agent == "mine" and again.created_at > first.created_at
    figures = ("transitions", "sp_token_accuracy", "sp_exact_match", "id_accuracy", "id_chance", "probe_id")
    assert [getattr(again, f) for f in figures] == [getattr(first, f) for f in figures]
    assert [getattr(mine, f) for f in figures[:-1]] == [getattr(first, f) for f in figures[:-1]]


@pytest.mark.parametrize(
    "change, message",
    [
        (["--episodes", "0"], "--episodes must be >= 1, got 0"),
        (["--env", "nowhere"], "unknown env 'nowhere'"),
        (["--split", "bogus"], "unknown TextWorld split 'bogus'"),
        (["--checkpoint", "MISSING"], "is not a folder"),
        (["--checkpoint", "NO_TOKENIZER"], "holds no tokenizer"),
        (["--checkpoint", "NO_MODEL"], "holds no model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(change, message, tiny_checkpoint, tmp_path, capsys):
    folders = {"MISSING": tmp_path / "missing", "NO_TOKENIZER": tmp_path / "bare", "NO_MODEL": tmp_path / "empty"}
    (tmp_path / "bare").mkdir()
    (tmp_path / "empty").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "bare" / name).write_bytes((tiny_checkpoint / name).read_bytes())
    (tmp_path / "empty" / "tokenizer.json").write_text("{}")
    change = [str(folders.get(item, item)) for item in change]
    argv = ["--checkpoint", str(tiny_checkpoint), "--env", "textworld", "--split", "valid"]
    argv += ["--runs-dir", str(tmp_path / "runs"), "--device", "cpu"]
    assert probes.run(probe_args(*argv, *change)) == 2
    err = capsys.readouterr().err
    assert err.startswith("envrl probe: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()
