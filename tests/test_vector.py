"""The subprocess vector env: per-env seeds, batched text, same-step autoreset."""

from __future__ import annotations

import numpy as np

from envrl.envs.vector import make_vec


def test_vector_env_seeds_batches_and_autoresets(with_official_data):
    vec = make_vec("alfworld", 2, split="valid_seen", expert_plan=True)
    try:
        observations, infos = vec.reset(seed=[5, 6])
        assert isinstance(observations, tuple) and len(observations) == 2
        assert all(o.startswith("-= Welcome to TextWorld, ALFRED! =-") for o in observations)
        first_tasks = list(infos["task_id"])
        again, again_infos = vec.reset(seed=[5, 6])
        assert again == observations and list(again_infos["task_id"]) == first_tasks

        finished = 0
        for _ in range(40):
            actions = [plan[0] if len(plan) else "look" for plan in infos["expert_plan"]]
            observations, rewards, terminated, truncated, infos = vec.step(actions)
            for i in np.flatnonzero(terminated):
                finished += 1
                assert rewards[i] == 1.0
                assert infos["final_info"]["success"][i]
                # same-step autoreset: the next episode's intro is already here
                assert observations[i].startswith("-= Welcome to TextWorld, ALFRED! =-")
                assert infos["step"][i] == 0
        assert finished >= 4
    finally:
        vec.close()
