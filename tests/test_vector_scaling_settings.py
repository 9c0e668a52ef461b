"""benchmarks/vector_scaling.py's per-env settings name registered envs and their splits (no env is stepped)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import vector_scaling  # noqa: E402
from envrl.envs import REGISTRY  # noqa: E402


def test_the_settings_name_registered_envs_and_their_splits():
    vector_scaling.check_settings(vector_scaling.SETTINGS)  # also run when the module is imported
    for env, (kwargs, _) in vector_scaling.SETTINGS.items():
        assert kwargs["split"] in REGISTRY[env].splits, env


def test_a_setting_for_an_unregistered_env_is_refused_in_one_sentence():
    with pytest.raises(ValueError, match=r"^vector_scaling SETTINGS names 'alfwrld', which is not a registered env \("):
        vector_scaling.check_settings({"alfwrld": ({"split": "valid_seen"}, 400)})


def test_a_setting_on_a_split_the_env_lacks_is_refused_in_one_sentence():
    with pytest.raises(ValueError, match=r"^vector_scaling SETTINGS plays 'webshop' on split 'dev', which it lacks \("):
        vector_scaling.check_settings({"webshop": ({"split": "dev"}, 3000)})
