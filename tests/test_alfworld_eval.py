"""Evaluation runs on the real ALFWorld env (official samples): parallel, recorded, resumable."""

from __future__ import annotations

import json

from envrl.evaluation import ResultStore, leaderboard, run_evaluation


def test_expert_and_random_runs_on_official_games(with_official_data, tmp_path):
    expert = run_evaluation(
        "alfworld", "valid_seen", "expert", episodes=6, workers=2, runs_dir=tmp_path, progress=False
    )
    assert expert.episodes_done == 6 and expert.errors == 0
    assert expert.metrics.overall.success_rate == 1.0
    random = run_evaluation(
        "alfworld",
        "valid_seen",
        "random",
        episodes=4,
        workers=2,
        runs_dir=tmp_path,
        progress=False,
        env_kwargs={"max_episode_steps": 5},
    )
    assert random.episodes_done == 4

    episodes = ResultStore(tmp_path).load_episodes(expert.run_id)
    assert sorted(e.episode_index for e in episodes) == list(range(6))
    first = min(episodes, key=lambda e: e.episode_index)
    assert first.task_id.startswith("official:valid_seen/")
    assert first.turns == len(first.trajectory) and first.trajectory[-1].reward == 1.0
    assert all(step.valid for step in first.trajectory)
    # the JSONL file holds the same episodes
    lines = (tmp_path / expert.run_id / "episodes.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["episode_index"] for line in lines) == list(range(6))

    rows = {row["agent"]: row for row in json.loads(leaderboard(tmp_path, "json", runs=True))}
    assert rows["expert"]["successes"] == 6
    assert rows["random"]["episodes_done"] == 4 and rows["random"]["mean_turns"] == 5.0

    # the same command again resumes: nothing to play, nothing duplicated
    again = run_evaluation("alfworld", "valid_seen", "expert", episodes=6, workers=2, runs_dir=tmp_path, progress=False)
    assert again.episodes_played == 0 and again.episodes_done == 6
