"""The budgets benchmarks/repro/early_experience.py gives each method (no training is run).

The paper trains IWM's world model first and then runs full SFT, so the comparison must give
IWM's imitation stage as many updates as the SFT baseline, with the world-model stage in front.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.repro import early_experience as repro  # noqa: E402
from envrl.training.algorithms import IWM, algorithm_class  # noqa: E402
from envrl.training.config import build_config  # noqa: E402

METHODS = {m.key: m for m in repro.METHODS}


def _config(method: repro.Method, args, tmp_path: Path):
    """The config run_method trains ``method`` with (the same --set items, on the same YAML)."""
    data = {key: tmp_path / key for key in ("expert-full", "expert-eighth", "ee-full", "ee-eighth")}
    sets = repro.method_sets(method, args, data) + [
        f"policy.model={tmp_path / 'model'}",
        f"out={tmp_path / method.key}",
        f"updates={repro.method_budget(method, args)['updates']}",
        "seed=0",
    ]
    algo = algorithm_class(method.algo)
    return build_config(method.algo, repro.ENV, algorithm_config=algo.Config, files=[repro.CONFIG], sets=sets)


@pytest.mark.parametrize(
    "argv, world_model, imitation",
    [
        ([], 50, 100),
        (["--updates", "40", "--wm-updates", "84"], 84, 40),
        (["--quick"], 2, 5),
        (["--wm-updates", "0"], 0, 100),
    ],
)
def test_iwm_imitates_for_as_many_updates_as_sft_after_its_world_model_stage(argv, world_model, imitation, tmp_path):
    args = repro.parse_args([*argv, "--out", str(tmp_path / "out")])
    for key in ("sft", "sft-eighth", "sr"):
        assert repro.method_budget(METHODS[key], args) == {
            "updates": imitation,
            "world_model": 0,
            "imitation": imitation,
        }
        assert _config(METHODS[key], args, tmp_path).updates == imitation
    for key in ("iwm", "iwm-eighth"):
        budget = repro.method_budget(METHODS[key], args)
        assert budget == {"updates": world_model + imitation, "world_model": world_model, "imitation": imitation}
        config = _config(METHODS[key], args, tmp_path)
        iwm = IWM(config.algorithm)
        switch = iwm.switch_update(config.updates)  # the update where IWM's imitation starts
        assert config.algorithm.schedule == "two_stage" and config.updates == world_model + imitation
        assert (switch, config.updates - switch) == (world_model, imitation)
        # imitation gets its own whole learning-rate schedule, as SFT's run has
        assert iwm.stage_starts(config.updates) == ([0, world_model] if world_model else [0])


def test_the_default_world_model_stage_is_half_of_imitation(tmp_path):
    args = repro.parse_args(["--out", str(tmp_path)])
    assert "--wm-updates" in (repro.__doc__ or "") and "--wm-fraction" not in (repro.__doc__ or "")
    assert args.wm_updates == 50 and args.updates == 100
