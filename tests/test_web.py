"""The results viewer (``envrl.evaluation.web``) through Flask's test client.

The store holds real runs (WebShop, random and expert agents, ID and OOD splits, played by
``run_evaluation``), a hand-made run whose trajectory, task ids and agent output are hostile
HTML, and a run with no episode yet. The helpers at the top are also used by
``test_web_browser.py``.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flask")
pytest.importorskip("matplotlib")
bs4 = pytest.importorskip("bs4")

from envrl.evaluation.leaderboard import leaderboard_data, split_kind  # noqa: E402
from envrl.evaluation.metrics import compute_metrics, summarize  # noqa: E402
from envrl.evaluation.runner import run_evaluation  # noqa: E402
from envrl.evaluation.store import EpisodeRecord, ResultStore, StepRecord  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: would change the page if it ever ran: the browser test checks both effects are absent
HOSTILE_SCRIPT = "<script>window.__pwned=1;document.title='pwned'</script>"
HOSTILE_MARKUP = '"quotes" & <b>tags</b>'
HOSTILE_IMG = '<img src=x onerror="window.__pwned=2">'
HOSTILE_RUN = "hostile-<i>run"
HOSTILE_AGENT = "llm<b>agent</b>"
EMPTY_RUN = "empty-run"

REAL_RUNS = [(agent, split) for agent in ("random", "expert") for split in ("test", "test_ood")]


# ---- the store ---------------------------------------------------------------------------


def _config(env: str, split: str, agent: str, episodes: int, **extra: Any) -> dict[str, Any]:
    return {
        "env": env,
        "env_id": "envrl/WebShop-v0",
        "split": split,
        "agent": agent,
        "episodes": episodes,
        "seed": 0,
        "env_kwargs": {},
        **extra,
    }


def hostile_records(run_id: str = HOSTILE_RUN) -> list[EpisodeRecord]:
    """Two episodes whose every free-text field carries markup; the first with LLM agent info."""
    steps = [
        StepRecord(
            action=f"search[{HOSTILE_SCRIPT}]",
            observation=f"results {HOSTILE_MARKUP}",
            reward=0.0,
            valid=True,
            agent_info={
                "think": f"I think {HOSTILE_MARKUP}",
                "response": f"{HOSTILE_IMG}\n<action>x</action>",
                "format_valid": False,
                "prompt_tokens": 100,
                "completion_tokens": 20,
                "latency": 0.5,
                "extra": [HOSTILE_SCRIPT],
            },
        ),
        StepRecord(
            action=f"click[{HOSTILE_MARKUP}]",
            observation=HOSTILE_SCRIPT,
            reward=0.0,
            valid=False,
            agent_info={
                "response": "<action>click</action>",
                "format_valid": True,
                "prompt_tokens": 150,
                "completion_tokens": 30,
                "latency": 1.5,
            },
        ),
        StepRecord(
            action="click[buy now]",
            observation=f"Thank you {HOSTILE_IMG}",
            reward=1.0,
            valid=True,
            agent_info={"error": f"server said {HOSTILE_SCRIPT}", "prompt_tokens": 50},
        ),
    ]
    common = dict(
        run_id=run_id,
        env_id="envrl/WebShop-v0",
        split="test",
        seed=0,
        agent=HOSTILE_AGENT,
        valid_action_ratio=2 / 3,
        wall_time=0.1,
        finished_at=time.time(),
    )
    return [
        EpisodeRecord(
            episode_index=0,
            task_id=f"task{HOSTILE_SCRIPT}",
            task_type="<b>type</b>",
            success=True,
            score=1.0,
            turns=3,
            trajectory=steps,
            initial_observation=f"Start {HOSTILE_SCRIPT}",
            **common,
        ),
        EpisodeRecord(
            episode_index=1,
            task_id=f"task2 {HOSTILE_MARKUP}",
            task_type="<b>type</b>",
            success=False,
            score=0.0,
            turns=0,
            trajectory=[],
            initial_observation=HOSTILE_IMG,
            error=f"RuntimeError: {HOSTILE_SCRIPT}",
            **common,
        ),
    ]


def build_store(runs_dir: Path, episodes: int = 6) -> Path:
    """Real WebShop runs (random and expert on test and test_ood), the hostile run and an
    empty run, under ``runs_dir``."""
    for agent, split in REAL_RUNS:
        run_evaluation("webshop", split, agent, episodes, runs_dir=runs_dir, progress=False)
    store = ResultStore(runs_dir)
    with store.open_run(HOSTILE_RUN, _config("webshop", "test", HOSTILE_AGENT, 2, note=HOSTILE_SCRIPT)) as writer:
        for record in hostile_records():
            writer.append(record)
    store.open_run(EMPTY_RUN, _config("webshop", "test_ood", "nobody", 5)).close()
    return runs_dir


# ---- formatting as the pages show it ------------------------------------------------------


def pct(value: float) -> str:
    return f"{100 * value:.1f}"


def ci(low: float, high: float) -> str:
    return f"[{pct(low)}, {pct(high)}]"


def turns(value: float | None) -> str:
    return "\u2013" if value is None else f"{value:.1f}"


# ---- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return build_store(tmp_path_factory.mktemp("web-runs"))


@pytest.fixture(scope="module")
def app(runs_dir):
    from envrl.evaluation.web import create_app

    return create_app(runs_dir)


@pytest.fixture()
def client(app):
    return app.test_client()


@pytest.fixture(scope="module")
def runs(runs_dir) -> dict[str, dict[str, Any]]:
    return {run["run_id"]: run for run in ResultStore(runs_dir).list_runs()}


def soup_of(response) -> Any:
    return bs4.BeautifulSoup(response.get_data(as_text=True), "html.parser")


def page(client, url: str) -> Any:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return soup_of(response)


def run_url(run_id: str) -> str:
    """The run page's path as the app writes it (the run ids here need only ``<>`` quoted)."""
    return "/runs/" + run_id.replace("<", "%3C").replace(">", "%3E")


def real_run_ids() -> list[str]:
    return [f"webshop-{split}-{agent}-s0" for agent, split in REAL_RUNS]


def text(node: Any) -> str:
    return " ".join(node.get_text(" ").split())


# ---- leaderboard -------------------------------------------------------------------------


def test_leaderboard_shows_every_measured_cell_with_its_numbers(client, runs_dir, runs):
    data = leaderboard_data(runs_dir)
    soup = page(client, "/")
    table = soup.find("table", id="leaderboard")
    assert table is not None
    shown_agents = {text(th.find(class_="agent-name")) for th in table.find_all("th", class_="agent")}
    assert {"random", "expert", HOSTILE_AGENT} <= shown_agents
    assert [text(th).split()[0] for th in table.find_all("th", class_="split")] == [c["split"] for c in data["columns"]]

    checked = 0
    for row in data["rows"]:
        for key, cell in row["cells"].items():
            if not cell.get("run_id"):
                continue
            td = table.find("td", attrs={"data-column": key, "data-run": cell["run_id"]})
            assert td is not None, (row["agent"], key)
            assert td.find("a", class_="rate")["href"] == run_url(cell["run_id"])
            m = summarize(runs[cell["run_id"]]["episodes"])
            if cell["success_rate"] is None:  # a run with no episode yet
                assert m.episodes == 0
                assert text(td) == "\u2013"
                continue
            assert f"turns {turns(cell.get('mean_turns'))} / {turns(cell.get('mean_turns_success'))}" in text(td)
            assert text(td.find(class_="rate")) == pct(cell["success_rate"])
            assert text(td.find(class_="ci")) == ci(cell["ci_low"], cell["ci_high"])
            # and the data is what the metrics say about the run's episodes
            assert cell["success_rate"] == pytest.approx(m.success_rate)
            assert (cell["ci_low"], cell["ci_high"]) == pytest.approx((m.ci_low, m.ci_high))
            checked += 1
    assert checked >= len(REAL_RUNS)


def test_leaderboard_lists_every_run(client, runs):
    soup = page(client, "/")
    listed = {tr["data-run"]: tr for tr in soup.find("table", id="runs").find("tbody").find_all("tr")}
    assert set(listed) == set(runs)
    for run_id, run in runs.items():
        tr = listed[run_id]
        m = summarize(run["episodes"])
        assert text(tr.find("a")) == run_id
        assert text(tr.find(class_="episodes")) == f"{m.episodes}/{max(run['episodes_planned'], m.episodes)}"
        expected = f"{pct(m.success_rate)} {ci(m.ci_low, m.ci_high)}" if m.episodes else "\u2013"
        assert text(tr.find(class_="success")) == expected
        assert [text(td) for td in tr.find_all("td")[1:4]] == [run["env"], run["split"], run["agent"]]
    assert text(listed[EMPTY_RUN].find(class_="episodes")) == "0/5"


FIXED_DATA = {
    "columns": [
        {"key": "alfworld/valid_seen", "env": "alfworld", "split": "valid_seen", "kind": "ID"},
        {"key": "alfworld/valid_unseen", "env": "alfworld", "split": "valid_unseen", "kind": "OOD"},
        {"key": "webshop/test", "env": "webshop", "split": "test", "kind": "ID"},
    ],
    "rows": [
        {
            "agent": "expert",
            "source": "measured",
            "reference": None,
            "protocol": {"template": "none", "max_steps": 50},
            "cells": {
                "alfworld/valid_seen": {
                    "run_id": "webshop-test-expert-s0",
                    "success_rate": 0.7,
                    "ci_low": 0.6,
                    "ci_high": 0.8,
                    "episodes": 140,
                    "mean_turns": 12.3,
                    "mean_turns_success": 8.1,
                    "rank": 1,
                    "protocol_note": None,
                }
            },
        },
        {
            "agent": f"ReAct {HOSTILE_MARKUP}",
            "source": "reported",
            "reference": {
                "paper": "ReAct (Yao et al., 2023)",
                "url": "https://arxiv.org/abs/2210.03629",
                "model": "PaLM-540B",
                "protocol": "two-shot prompts",
                "note": f"best of 6 {HOSTILE_SCRIPT}",
            },
            "protocol": {},
            "cells": {
                "alfworld/valid_unseen": {
                    "run_id": None,
                    "success_rate": 0.71,
                    "ci_low": None,
                    "ci_high": None,
                    "episodes": None,
                    "mean_turns": None,
                    "mean_turns_success": None,
                    "rank": None,
                    "protocol_note": "step limit 30, others 50",
                }
            },
        },
        {
            "agent": "sneaky",
            "source": "reported",
            "reference": {
                "paper": "Sneaky",
                "url": "javascript:window.__pwned=1",
                "model": "m",
                "protocol": "p",
                "note": "",
            },
            "protocol": {},
            "cells": {
                "webshop/test": {
                    "run_id": None,
                    "success_rate": 0.5,
                    "ci_low": None,
                    "ci_high": None,
                    "episodes": None,
                    "mean_turns": None,
                    "mean_turns_success": None,
                    "rank": None,
                    "protocol_note": None,
                }
            },
        },
    ],
    "notes": ["Reported rows are not ranked.", f"note with {HOSTILE_MARKUP}"],
}


def test_leaderboard_separates_reported_rows(client, monkeypatch):
    from envrl.evaluation import web

    monkeypatch.setattr(web, "leaderboard_data", lambda runs_dir: FIXED_DATA)
    response = client.get("/")
    assert response.status_code == 200
    body = response.get_data(as_text=True)
    soup = soup_of(response)
    table = soup.find("table", id="leaderboard")
    assert [text(th) for th in table.find_all("th", class_="env")] == ["alfworld", "webshop"]
    assert [th["colspan"] for th in table.find_all("th", class_="env")] == ["2", "1"]

    measured = soup.find("tbody", id="measured").find_all("tr", class_="row-measured")
    reported = soup.find("tbody", id="reported").find_all("tr", class_="row-reported")
    assert [text(r.find(class_="agent-name")) for r in measured] == ["expert"]
    assert [text(r.find(class_="agent-name")) for r in reported] == [f"ReAct {HOSTILE_MARKUP}", "sneaky"]
    assert all(r.find(class_="badge-reported") for r in reported)
    assert not measured[0].find(class_="badge-reported")

    expert_cells = measured[0].find_all("td")
    assert text(expert_cells[0]) == "70.0 [60.0, 80.0] #1 turns 12.3 / 8.1 n=140"
    assert expert_cells[0].find("a")["href"] == "/runs/webshop-test-expert-s0"
    assert "empty" in expert_cells[1]["class"] and "empty" in expert_cells[2]["class"]
    assert "template" in text(measured[0].find("details", class_="protocol"))

    react = reported[0]
    assert react.find("a", href="https://arxiv.org/abs/2210.03629") is not None
    assert "PaLM-540B" in text(react) and "two-shot prompts" in text(react)
    cell = react.find("td", attrs={"data-column": "alfworld/valid_unseen"})
    assert text(cell) == "71.0 step limit 30, others 50"  # no CI, no turns, no n, no link
    assert cell.find("a") is None
    # a non-http link from the data is shown as text, never as a link
    assert not soup.find("a", href=re.compile("javascript", re.I))
    assert "Sneaky" in text(reported[1])

    assert [text(li) for li in soup.find("ul", id="notes").find_all("li")] == FIXED_DATA["notes"]
    assert "<script" not in body and "<b>tags" not in body
    assert "&lt;b&gt;tags&lt;/b&gt;" in body


def test_leaderboard_of_an_empty_store(tmp_path):
    from envrl.evaluation.web import create_app

    response = create_app(tmp_path / "nothing-here").test_client().get("/")
    assert response.status_code == 200
    assert "No runs in this store yet" in response.get_data(as_text=True)
    assert not (tmp_path / "nothing-here").exists()  # viewing does not create a store


# ---- run pages ---------------------------------------------------------------------------


@pytest.mark.parametrize("run_id", real_run_ids())
def test_run_page_numbers_match_the_metrics(client, runs, run_id):
    run = runs[run_id]
    report = compute_metrics(run["episodes"])
    soup = page(client, f"/runs/{run_id}")
    assert text(soup.find("h1", id="run-id")) == run_id

    overall = text(soup.find("dl", id="overall"))
    m = report.overall
    assert f"episodes {m.episodes}/{run['episodes_planned']}" in overall
    assert f"success % {pct(m.success_rate)} {ci(m.ci_low, m.ci_high)}" in overall
    assert f"mean turns {turns(m.mean_turns)}" in overall
    assert f"turns of successes {turns(m.mean_turns_success)}" in overall

    rows = {tr["data-task-type"]: tr for tr in soup.find("table", id="task-types").find("tbody").find_all("tr")}
    assert set(rows) == {""} | set(report.by_task_type)
    for name, tm in [("", m), *report.by_task_type.items()]:
        cells = [text(td) for td in rows[name].find_all("td")]
        assert cells[:3] == [str(tm.episodes), str(tm.successes), f"{pct(tm.success_rate)} {ci(tm.ci_low, tm.ci_high)}"]
        assert cells[4:6] == [turns(tm.mean_turns), turns(tm.mean_turns_success)]

    episodes = soup.find("table", id="episodes").find("tbody").find_all("tr")
    assert [int(tr["data-index"]) for tr in episodes] == [e["episode_index"] for e in run["episodes"]]
    for tr, e in zip(episodes, run["episodes"]):
        cells = [text(td) for td in tr.find_all("td")]
        assert cells[:6] == [
            str(e["episode_index"]),
            e["task_id"],
            e["task_type"],
            "yes" if e["success"] else "no",
            f"{e['score']:.2f}",
            str(e["turns"]),
        ]
        assert tr.find("a", class_="episode-link")["href"] == f"/runs/{run_id}/episodes/{e['episode_index']}"

    # the same agent on every split of the env, ID before OOD, with the kinds the leaderboard module gives
    splits = soup.find("table", id="splits").find("tbody").find_all("tr")
    expected = sorted(
        (r for r in runs.values() if r["env"] == run["env"] and r["agent"] == run["agent"]),
        key=lambda r: (split_kind(r["env"], r["split"]) != "ID", r["split"]),
    )
    assert [tr["data-run"] for tr in splits] == [r["run_id"] for r in expected]
    assert {tr["data-run"]: text(tr.find(class_="kind")) for tr in splits} == {
        r["run_id"]: split_kind(r["env"], r["split"]) for r in expected
    }
    assert [tr["data-run"] for tr in splits if "current" in (tr.get("class") or [])] == [run_id]

    assert [img["src"] for img in soup.find_all("img", class_="plot")] == [
        f"/runs/{run_id}/plots/{name}.png" for name in ("task_types", "turns", "splits")
    ]
    assert '"agent": "' + run["agent"] + '"' in text(soup.find("pre", id="config"))
    assert soup.find(id="agent-stats") is None  # random and expert report no agent_info


def test_run_page_shows_llm_agent_figures(client):
    soup = page(client, f"/runs/{HOSTILE_RUN}")
    stats = text(soup.find("dl", id="agent-stats"))
    assert "steps with model output 3" in stats
    assert "format-invalid responses 50.0% (1/2)" in stats
    assert "model errors 1" in stats
    assert "prompt tokens 300" in stats and "completion tokens 50" in stats
    assert "mean latency (s) 1.00" in stats


def test_run_page_of_a_run_without_episodes(client):
    soup = page(client, f"/runs/{EMPTY_RUN}")
    assert "episodes 0/5" in text(soup.find("dl", id="overall"))
    assert "No episode recorded yet" in text(soup)
    for name in ("task_types", "turns", "splits"):
        response = client.get(f"/runs/{EMPTY_RUN}/plots/{name}.png")
        assert response.status_code == 200 and response.data.startswith(PNG_SIGNATURE)


# ---- trajectory viewer ---------------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["webshop-test-expert-s0", "webshop-test_ood-random-s0"])
def test_trajectory_viewer_walks_every_step(client, runs_dir, run_id):
    record = ResultStore(runs_dir).load_episodes(run_id)[1]
    n = len(record.trajectory)
    assert n > 0
    base = f"/runs/{run_id}/episodes/{record.episode_index}"

    soup = page(client, base)
    header = text(soup.find("dl", id="episode-header"))
    assert f"task id {record.task_id}" in header and f"task type {record.task_type}" in header
    assert f"turns {record.turns}" in header and f"score {record.score:.2f}" in header
    assert text(soup.find(id="step-counter")) == f"step 0 of {n}"
    assert soup.find(id="observation").get_text() == record.initial_observation
    assert soup.find(id="prev") is None and soup.find(id="action") is None
    items = soup.find("ol", id="actions").find_all("li")
    assert [text(li) for li in items[1:]] == [" ".join(s.action.split()) for s in record.trajectory]
    assert [li.find("a")["href"] for li in items] == [f"{base}?step={k}" for k in range(n + 1)]
    assert soup.find("a", id="next")["href"] == f"{base}?step=1"
    assert soup.find(id="prev-episode")["href"] == f"/runs/{run_id}/episodes/0"

    for k, step in enumerate(record.trajectory, 1):
        soup = page(client, f"{base}?step={k}")
        assert text(soup.find(id="step-counter")) == f"step {k} of {n}"
        assert soup.find(id="action").get_text() == step.action
        assert soup.find(id="observation").get_text() == step.observation
        assert text(soup.find(id="reward")) == f"{step.reward:.2f}"
        assert text(soup.find(id="valid")) == ("valid action" if step.valid else "invalid action")
        assert soup.find("a", id="prev")["href"] == f"{base}?step={k - 1}"
        assert "current" in soup.find("ol", id="actions").find_all("li")[k]["class"]
        if k < n:
            assert soup.find("a", id="next")["href"] == f"{base}?step={k + 1}"
        else:
            assert soup.find(id="next") is None


def test_trajectory_viewer_shows_agent_info(client):
    base = f"{run_url(HOSTILE_RUN)}/episodes/0"
    soup = page(client, f"{base}?step=1")
    info = soup.find("dl", id="agent-info")
    keys = [text(dt) for dt in info.find_all("dt")]
    assert keys == ["think", "response", "format_valid", "prompt_tokens", "completion_tokens", "latency", "extra"]
    values = dict(zip(keys, (dd.get_text() for dd in info.find_all("dd"))))
    assert values["think"] == f"I think {HOSTILE_MARKUP}"
    assert values["response"] == f"{HOSTILE_IMG}\n<action>x</action>"
    assert values["format_valid"] == "false" and values["prompt_tokens"] == "100"
    soup = page(client, f"{base}?step=3")
    assert "server said" in text(soup.find("dl", id="agent-info"))
    # an episode recorded with an error shows it in its header
    soup = page(client, base.replace("/0", "/1"))
    assert text(soup.find(id="episode-error")) == f"RuntimeError: {HOSTILE_SCRIPT}"
    assert text(soup.find(id="step-counter")) == "step 0 of 0" and soup.find(id="next") is None


# ---- escaping ----------------------------------------------------------------------------


def hostile_urls() -> list[str]:
    run = run_url(HOSTILE_RUN)
    return ["/", run, f"{run}/episodes/1", "/runs/%3Cscript%3Ealert(1)%3C"] + [
        f"{run}/episodes/0?step={k}" for k in range(4)
    ]


@pytest.mark.parametrize("url", hostile_urls())
def test_hostile_text_is_escaped(client, url):
    response = client.get(url)
    assert response.status_code in (200, 404)
    body = response.get_data(as_text=True)
    lowered = body.lower()
    assert "<script" not in lowered
    assert "<img src=x" not in lowered and "onerror=" not in lowered.replace("onerror=&#34;", "")
    assert "<b>" not in lowered and "<i>run" not in lowered
    assert "&lt;" in body  # the hostile text is there, escaped


def test_hostile_text_reads_back_exactly(client):
    run = run_url(HOSTILE_RUN)
    body = client.get(f"{run}/episodes/0?step=1").get_data(as_text=True)
    assert "&lt;script&gt;window.__pwned=1;document.title=&#39;pwned&#39;&lt;/script&gt;" in body
    assert "&#34;quotes&#34; &amp; &lt;b&gt;tags&lt;/b&gt;" in body
    soup = bs4.BeautifulSoup(body, "html.parser")
    assert soup.find(id="action").get_text() == f"search[{HOSTILE_SCRIPT}]"
    assert text(soup.find(id="task-id")) == f"task{HOSTILE_SCRIPT}"
    assert text(soup.find("h1")).startswith("Episode 0")
    assert soup.find("script") is None and soup.find("b") is None
    body = client.get(run).get_data(as_text=True)
    assert "&#34;note&#34;: &#34;&lt;script&gt;" in body  # the config's JSON, escaped


# ---- 404s --------------------------------------------------------------------------------


def bad_urls() -> list[str]:
    run = "webshop-test-expert-s0"
    episode = f"/runs/{run}/episodes/0"
    return [
        "/nope",
        "/runs/",
        "/runs/nope",
        "/runs/nope/episodes/0",
        "/runs/nope/plots/turns.png",
        f"/runs/{run}/plots/nope.png",
        f"/runs/{run}/plots/turns.svg",
        f"/runs/{run}/plots/turns",
        f"/runs/{run}/plots/../config.png",
        f"/runs/{run}/episodes/99",
        f"/runs/{run}/episodes/-1",
        f"/runs/{run}/episodes/abc",
        f"/runs/{run}/episodes/1.5",
        f"/runs/{run}/episodes/",
        f"{episode}?step=-1",
        f"{episode}?step=abc",
        f"{episode}?step=1.5",
        f"{episode}?step=",
        f"{episode}?step=%201",
        f"{episode}?step=%EF%BC%91",  # a full-width digit one
        f"{episode}?step=99",
        f"{episode}?step=99999999999999999999999",
        f"/runs/{EMPTY_RUN}/episodes/0",
    ]


@pytest.mark.parametrize("url", bad_urls())
def test_bad_parameters_are_404(client, url):
    response = client.get(url)
    assert response.status_code == 404, url
    body = response.get_data(as_text=True)
    assert "Not found" in body and "Traceback" not in body


def test_last_step_is_found_and_one_past_it_is_not(client, runs_dir):
    record = ResultStore(runs_dir).load_episodes("webshop-test-expert-s0")[0]
    base = "/runs/webshop-test-expert-s0/episodes/0"
    assert client.get(f"{base}?step={record.turns}").status_code == 200
    assert client.get(f"{base}?step={record.turns + 1}").status_code == 404


# ---- plots -------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_SIGNATURE)
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("run_id", [*real_run_ids(), HOSTILE_RUN])
def test_plots_are_pngs_and_leave_no_figure_open(client, run_id):
    import matplotlib.pyplot as plt

    for name in ("task_types", "turns", "splits"):
        response = client.get(f"{run_url(run_id)}/plots/{name}.png")
        assert response.status_code == 200
        assert response.mimetype == "image/png"
        assert png_size(response.data) == (640, 320)
        assert client.get(f"{run_url(run_id)}/plots/{name}.png").data == response.data  # cached, same bytes
        again = client.get(f"{run_url(run_id)}/plots/{name}.png", headers={"If-None-Match": response.headers["ETag"]})
        assert again.status_code == 304
    assert len(plt.get_fignums()) == 0


def test_plot_functions_are_pure():
    import matplotlib.pyplot as plt

    from envrl.evaluation import plots

    bars = [
        plots.RateBar("a", 0.5, 0.2, 0.8, 10),
        plots.RateBar("b" * 40, 1.0, 0.7, 1.0, 5, kind="OOD", highlight=True),
    ]
    outputs = [
        plots.task_type_png(bars),
        plots.split_png(bars),
        plots.task_type_png([]),
        plots.split_png([]),
        plots.turns_histogram_png([3, 4, 4], [15, 15]),
        plots.turns_histogram_png([], []),
        plots.turns_histogram_png([1], [500]),
        plots.turns_histogram_png([7], []),
    ]
    assert all(png_size(png) == (640, 320) for png in outputs)
    assert plots.split_png(bars) == outputs[1]  # same data, same bytes
    assert len(plt.get_fignums()) == 0


# ---- a run being written -------------------------------------------------------------------


def test_pages_follow_a_run_while_it_is_written(client, runs_dir):
    """The viewer reads while a writer holds the run's lock, and shows each new episode."""
    store = ResultStore(runs_dir)
    source = store.load_episodes("webshop-test-expert-s0")
    run_id = "live-run"
    with store.open_run(run_id, _config("webshop", "test", "live", 4)) as writer:
        seen_plots = []
        for done, record in enumerate(source[:2], 1):
            record.run_id = run_id
            writer.append(record)
            soup = page(client, f"/runs/{run_id}")
            assert f"episodes {done}/4" in text(soup.find("dl", id="overall"))
            assert len(soup.find("table", id="episodes").find("tbody").find_all("tr")) == done
            page(client, f"/runs/{run_id}/episodes/{record.episode_index}?step={len(record.trajectory)}")
            seen_plots.append(client.get(f"/runs/{run_id}/plots/turns.png").data)
        assert seen_plots[0] != seen_plots[1]  # the cache follows the run


def file_digests(root: Path) -> dict[str, str]:
    """Content digests of the store's files (SQLite's transient -wal/-shm files aside)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def test_browsing_does_not_write_the_store(client, runs_dir, runs):
    before = file_digests(runs_dir)
    urls = ["/"]
    for run_id, run in runs.items():
        quoted = run_url(run_id)
        urls += [quoted] + [f"{quoted}/plots/{n}.png" for n in ("task_types", "turns", "splits")]
        urls += [f"{quoted}/episodes/{e['episode_index']}?step=1" for e in run["episodes"][:2] if e["turns"]]
    for url in urls:
        assert client.get(url).status_code == 200, url
    assert file_digests(runs_dir) == before


# ---- serve() -----------------------------------------------------------------------------


def _default_sigint() -> None:
    """In the child: SIGINT at its default (a background ``make test &`` hands children SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_serve_prints_its_url_and_exits_0_on_a_signal(runs_dir, signum):
    code = "import sys; from envrl.evaluation.web import serve; sys.exit(serve(sys.argv[1], port=0))"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(runs_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_default_sigint,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        url = f"{match.group(0)}runs/webshop-test-expert-s0/episodes/0?step=1"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert b'id="step-counter"' in response.read()
        proc.send_signal(signum)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_serve_reports_a_port_in_use(runs_dir, capsys):
    import socket

    from envrl.evaluation.web import serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert serve(runs_dir, port=taken.getsockname()[1]) == 1
    assert "cannot listen" in capsys.readouterr().err
