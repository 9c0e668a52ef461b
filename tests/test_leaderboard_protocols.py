"""The leaderboard ranks only runs of one env-side protocol, whichever protocol field differs.

Within a column (env, split) the most common protocol (step limit, task list, episodes, seed,
engine versions) is ranked; a run that differs in any one field keeps its numbers, gets no rank,
and its note names the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envrl.evaluation import EpisodeRecord, ResultStore, StepRecord, leaderboard_data

BASE_CONFIG = {
    "env": "alfworld",
    "env_id": "envrl/ALFWorld-v0",
    "split": "valid_seen",
    "episodes": 10,
    "seed": 0,
    "env_kwargs": {},
    "step_limit": 50,
    "task_count": 140,
    "task_ids_sha256": "abc",
    "versions": {"alfworld": "0.4.2", "envrl": "0.1.0"},
}


def _record(run_id: str, index: int, success: bool) -> EpisodeRecord:
    return EpisodeRecord(
        run_id=run_id,
        episode_index=index,
        env_id="envrl/ALFWorld-v0",
        split="valid_seen",
        task_id=f"t{index}",
        task_type="pick",
        seed=index,
        agent=run_id,
        success=success,
        score=float(success),
        turns=5,
        valid_action_ratio=1.0,
        wall_time=0.01,
        error=None,
        trajectory=[StepRecord(action="look", observation="o", reward=0.0, valid=True)],
        initial_observation="start",
        finished_at=1.0 + index,
    )


def _write_run(runs_dir: Path, agent: str, successes: int, **overrides) -> None:
    config = {**BASE_CONFIG, "agent": agent, **overrides}
    with ResultStore(runs_dir).open_run(agent, config) as writer:
        for i in range(config["episodes"]):
            writer.append(_record(agent, i, i < successes))


@pytest.mark.parametrize(
    "difference, note",
    [
        ({"step_limit": 30}, "step limit 30 (ranked runs: 50)"),
        ({"task_ids_sha256": "def"}, "task list differ"),
        ({"seed": 5}, "seed 5 (ranked runs: 0)"),
        ({"episodes": 12}, "episodes 12 (ranked runs: 10)"),
        ({"versions": {"alfworld": "0.4.3", "envrl": "0.1.0"}}, "engine versions differ"),
    ],
)
def test_a_run_under_another_protocol_is_not_ranked(tmp_path, difference, note):
    _write_run(tmp_path, "agent-a", 6)
    _write_run(tmp_path, "agent-b", 8)
    _write_run(tmp_path, "agent-odd", 10, **difference)  # the best figure, but not comparable
    rows = {r["agent"]: r for r in leaderboard_data(tmp_path, include_reported=False)["rows"]}
    cells = {agent: row["cells"]["alfworld/valid_seen"] for agent, row in rows.items()}
    assert (cells["agent-b"]["rank"], cells["agent-a"]["rank"]) == (1, 2)
    odd = cells["agent-odd"]
    assert odd["rank"] is None and odd["protocol_note"] == note
    assert odd["success_rate"] == pytest.approx(
        10 / BASE_CONFIG["episodes"] if "episodes" not in difference else 10 / 12
    )


def test_envrls_own_version_does_not_split_the_protocol(tmp_path):
    _write_run(tmp_path, "agent-a", 6)
    _write_run(tmp_path, "agent-b", 8, versions={"alfworld": "0.4.2", "envrl": "0.2.0"})
    rows = {r["agent"]: r for r in leaderboard_data(tmp_path, include_reported=False)["rows"]}
    assert [rows[a]["cells"]["alfworld/valid_seen"]["rank"] for a in ("agent-b", "agent-a")] == [1, 2]
