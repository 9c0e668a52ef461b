"""The YAML layers of a training config: an env base, an algorithm's delta, ``extends`` and the deep merge."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("yaml")

from envrl.training.algorithms import ALGORITHMS, algorithm_class  # noqa: E402
from envrl.training.config import (  # noqa: E402
    ConfigError,
    build_config,
    deep_merge,
    resolve_yaml,
    shipped_config,
    shipped_files,
)

REAL_ENVS = ("alfworld", "scienceworld", "textworld", "webshop")


def test_deep_merge_merges_mappings_and_replaces_everything_else() -> None:
    base = {"a": 1, "s": {"x": 1, "y": {"p": 1, "q": 2}, "l": [1, 2]}, "keep": "k"}
    delta = {"a": 2, "s": {"y": {"q": 3, "r": 4}, "l": [9]}, "new": None}
    assert deep_merge(base, delta) == {
        "a": 2,
        "s": {"x": 1, "y": {"p": 1, "q": 3, "r": 4}, "l": [9]},
        "keep": "k",
        "new": None,
    }
    assert base == {"a": 1, "s": {"x": 1, "y": {"p": 1, "q": 2}, "l": [1, 2]}, "keep": "k"}  # unchanged
    assert deep_merge({"s": {"x": 1}}, {"s": 5}) == {"s": 5}  # a non-mapping replaces a mapping
    assert deep_merge({"s": 5}, {"s": {"x": 1}}) == {"s": {"x": 1}}


def test_extends_resolves_parents_in_order_then_the_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.yaml").write_text("optim: {lr: 0.1, epochs: 2}\nupdates: 3\n")
    (tmp_path / "sub" / "b.yaml").write_text("extends: ../a.yaml\noptim: {lr: 0.2}\n")
    (tmp_path / "c.yaml").write_text("optim: {lr: 0.3, minibatches: 4}\n")
    (tmp_path / "top.yaml").write_text("extends: [sub/b.yaml, c.yaml]\nupdates: 5\n")
    assert resolve_yaml(tmp_path / "top.yaml") == {"optim": {"lr": 0.3, "epochs": 2, "minibatches": 4}, "updates": 5}
    config = build_config(
        "grpo", "textworld", algorithm_config=algorithm_class("grpo").Config, files=[tmp_path / "top.yaml"]
    )
    assert (config.optim.lr, config.optim.epochs, config.optim.minibatches, config.updates) == (0.3, 2, 4, 5)
    assert config.rollout.max_steps == 50  # the shipped layers are still below the --config file


def test_a_missing_base_is_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "top.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError) as info:
        resolve_yaml(tmp_path / "top.yaml")
    assert (
        str(info.value)
        == f"config file {tmp_path / 'top.yaml'} extends nowhere.yaml, and {tmp_path / 'nowhere.yaml'} does not exist"
    )


def test_a_cycle_is_refused_naming_its_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    a, b = (tmp_path / "a.yaml").resolve(), (tmp_path / "b.yaml").resolve()
    with pytest.raises(ConfigError) as info:
        resolve_yaml(tmp_path / "a.yaml")
    assert str(info.value) == f"config files extend each other in a cycle: {a} -> {b} -> {a}"
    (tmp_path / "self.yaml").write_text("extends: self.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        resolve_yaml(tmp_path / "self.yaml")


def test_extends_must_name_files(tmp_path: Path) -> None:
    (tmp_path / "top.yaml").write_text("extends: {a: 1}\n")
    with pytest.raises(ConfigError, match="extends takes a file name or a list of them"):
        resolve_yaml(tmp_path / "top.yaml")


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
@pytest.mark.parametrize("env", REAL_ENVS)
def test_every_shipped_pair_resolves_on_its_env_base(algo: str, env: str) -> None:
    files = shipped_files(algo, env)
    assert [p.relative_to(p.parents[1]).as_posix() for p in files][:1] == [f"_base/{env}.yaml"]
    config = build_config(algo, env, algorithm_config=algorithm_class(algo).Config)
    base = resolve_yaml(files[0])
    assert config.rollout.max_steps == base["rollout"]["max_steps"]
    assert config.eval.splits == base["eval"]["splits"]
    assert (config.policy.history, config.policy.max_new_tokens, config.eval.episodes) == (2, 512, 128)


def test_envrl_on_webshop_resolves_to_its_pinned_settings() -> None:
    """The settings the 24 whole files held before they were layered, pinned for one pair."""
    config = build_config("envrl", "webshop", algorithm_config=algorithm_class("envrl").Config).to_dict()
    assert shipped_config("envrl", "webshop") == {
        "updates": 150,
        "policy": {"template": "think-action", "history": 2, "temperature": 1.0, "max_new_tokens": 512},
        "rollout": {"groups": 16, "group_size": 8, "max_steps": 15},
        "optim": {"lr": 1.0e-6, "micro_batch_size": 8, "max_grad_norm": 1.0},
        "eval": {"every": 10, "episodes": 128, "splits": ["test", "test_ood"]},
        "algorithm": {
            "norm": "mean",
            "invalid_penalty": 0.1,
            "clip_eps": 0.2,
            "kl_coef": 0.01,
            "base": "grpo",
            "sp": True,
            "id": True,
            "sp_coef": 0.01,
            "id_coef": 0.001,
            "decay": "cosine",
            "aux_fraction": 1.0,
        },
    }
    assert config["updates"] == 150 and config["rollout"]["max_steps"] == 15
    assert config["algorithm"]["norm"] == "mean" and config["algorithm"]["sp_template"] == "follow-up-state-prediction"
    assert config["optim"]["schedule"] == "constant"  # a default no layer sets


def test_iwm_and_sr_keep_sft_settings_and_their_own() -> None:
    iwm = build_config("iwm", "alfworld", algorithm_config=algorithm_class("iwm").Config)
    sr = build_config("sr", "alfworld", algorithm_config=algorithm_class("sr").Config)
    for config in (iwm, sr):
        assert (config.updates, config.optim.lr, config.optim.schedule, config.eval.every) == (200, 1e-5, "cosine", 50)
        assert config.algorithm.batch_size == 32
    assert (iwm.policy.template, iwm.algorithm.template) == ("action", "world-model")
    assert (sr.policy.template, sr.algorithm.writer) == ("think-action", "contrast")


@dataclasses.dataclass
class _ToyConfig:
    lr_scale: float = 1.0


def test_an_algorithm_without_files_runs_on_the_env_base_and_its_defaults() -> None:
    assert [p.parent.name for p in shipped_files("toy", "webshop")] == ["_base"]
    config = build_config("toy", "webshop", algorithm_config=_ToyConfig)
    assert config.rollout.max_steps == 15 and config.eval.splits == ["test", "test_ood"]
    assert config.updates == 10 and config.policy.template == "action"  # TrainConfig's defaults
    assert config.algorithm == _ToyConfig()


def test_an_env_without_a_base_uses_the_defaults() -> None:
    assert shipped_files("grpo", "diag-chain") == [] and shipped_config("grpo", "diag-chain") == {}
    config = build_config("grpo", "diag-chain", algorithm_config=algorithm_class("grpo").Config)
    assert config.updates == 10 and config.rollout.max_steps == 0
