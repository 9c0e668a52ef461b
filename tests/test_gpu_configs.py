"""The GPU recipes (benchmarks/configs/gpu) resolve and pass every start-time check on CPU.

No GPU is lent to this project yet, so a recipe's first real use would be its first load: a
stale key or option would then cost a GPU session. Each file goes through exactly what
``envrl train --config FILE`` does before it loads weights (:func:`build_config` with the
command line's overrides, then the algorithm's ``check``), plus the other checks a run meets at
start (template, splits, schedule, :func:`~envrl.training.preflight.preflight` for the recipe's
own launch line: bf16 on a GPU that has it). The hub model the recipes name cannot be loaded
here, so ``--model`` points at the tests' tiny local checkpoint; the data sets SFT, IWM and SR
need are made here, small, with the commands that make the real ones.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from envrl.agents.prompts import load_template  # noqa: E402
from envrl.envs import SPLIT_KINDS  # noqa: E402
from envrl.training.algorithms import algorithm_class  # noqa: E402
from envrl.training.config import ConfigError, TrainConfig, build_config  # noqa: E402
from envrl.training.preflight import check_precision, preflight  # noqa: E402

GPU_CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs" / "gpu"
FILES = sorted(GPU_CONFIGS.glob("*.yaml"))
ALGOS = ("sft", "sr", "iwm", "grpo", "envrl")
ENVS = ("alfworld", "webshop")
#: the writer the SR recipes name (their header says to replace it with the real spec)
SR_WRITER = "openai:MODEL"


def test_the_folder_holds_one_recipe_per_algorithm_and_env() -> None:
    assert [f.name for f in FILES] == sorted(f"{a}_{e}.yaml" for a in ALGOS for e in ENVS)


class StandInWriter:
    """Writes rationales as `envrl data rationales --writer openai:MODEL` would record them (its spec),
    with a fixed text: SR's check only asks that the folder holds that writer's file."""

    spec = SR_WRITER

    def write(self, rows: list[dict[str, Any]]) -> list[str]:
        return [f"{row['expert_action']} leads on; {row['action']} does not." for row in rows]

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Per (algo, env), the ``--data`` folder: expert data for SFT, early experience for IWM and SR."""
    from envrl.training.data import collect_expert_data
    from envrl.training.early_experience import build_early_experience
    from envrl.training.rationales import write_rationales

    root = tmp_path_factory.mktemp("gpu-config-data")
    folders: dict[tuple[str, str], Path] = {}
    for env in ENVS:
        expert = collect_expert_data(env, "train", 1, root / f"{env}-expert", template="action", history=2)
        folders["sft", env] = expert
        for algo in ("iwm", "sr"):
            folders[algo, env] = build_early_experience(
                env, "train", expert, root / f"{env}-{algo}-ee", k=2, proposer="admissible"
            )
        write_rationales(folders["sr", env], StandInWriter())
    return folders


def resolve(path: Path, model: Path, out: Path, data_dir: Path | None) -> TrainConfig:
    """``path`` resolved as ``envrl train --algo A --env E --model M --out O [--data D] --config path`` does."""
    algo, env = path.stem.split("_")
    overrides: dict[str, Any] = {"policy.model": str(model), "out": str(out)}
    if data_dir is not None:
        overrides["algorithm.data"] = str(data_dir)
    return build_config(algo, env, algorithm_config=algorithm_class(algo).Config, files=[path], overrides=overrides)


def launch_line(path: Path) -> list[str]:
    """The ``accelerate launch ...`` command the recipe's header gives, as arguments."""
    lines = [line.lstrip("#").strip() for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    start = next(i for i, line in enumerate(lines) if line.startswith("accelerate launch"))
    text = ""
    for line in lines[start:]:
        text += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            break
    return shlex.split(text)


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_recipe_resolves_and_passes_its_checks(path: Path, data, tiny_checkpoint: Path, tmp_path: Path) -> None:
    from envrl.training.loop import lr_schedule

    algo, env = path.stem.split("_")
    config = resolve(path, tiny_checkpoint, tmp_path / "run", data.get((algo, env)))
    algorithm = algorithm_class(algo)(config.algorithm)
    algorithm.check(config)
    # what the trainer meets next, before the first update
    load_template(config.policy.template)
    assert config.policy.action_mode in ("generate", "choose")
    assert config.rollout.split in SPLIT_KINDS[env]
    assert set(config.eval_splits()) <= set(SPLIT_KINDS[env]), config.eval_splits()
    lr_schedule(config, algorithm.stage_starts(config.updates))
    preflight(config, mixed_precision="bf16", device="cuda", bf16=True)
    # float32 master weights: accelerate's bf16 autocast does the compute (the recipes' comments)
    assert (config.policy.dtype, config.policy.lora_rank) == ("float32", 0)
    # the header's command is this file's: same algo, env, config path, bf16
    args = launch_line(path)
    assert args[:4] == ["accelerate", "launch", "--mixed_precision", "bf16"]
    flags = dict(zip(args, args[1:]))
    assert (flags["--algo"], flags["--env"], flags["--config"]) == (algo, env, f"benchmarks/configs/gpu/{path.name}")
    assert ("--data" in flags) == (algo in ("sft", "iwm", "sr"))


def test_recipes_name_the_settings_the_papers_use(data, tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The values the recipes are for (docs/envrl.md, docs/early_experience.md), as resolved."""
    got = {}
    for path in FILES:
        algo, env = path.stem.split("_")
        c = resolve(path, tiny_checkpoint, tmp_path / path.stem, data.get((algo, env)))
        got[path.stem] = (
            c.updates,
            c.rollout.max_steps,
            c.optim.lr,
            c.policy.template,
            c.algorithm.batch_size if algo in ("sft", "iwm", "sr") else c.rollout.groups * c.rollout.group_size,
        )
    assert got == {
        "envrl_alfworld": (150, 50, 1e-6, "think-action", 128),
        "envrl_webshop": (150, 15, 1e-6, "think-action", 128),
        "grpo_alfworld": (150, 50, 1e-6, "think-action", 128),
        "grpo_webshop": (150, 15, 1e-6, "think-action", 128),
        "iwm_alfworld": (8500, 50, 1e-5, "action", 32),
        "iwm_webshop": (1250, 15, 1e-5, "action", 32),
        "sft_alfworld": (2100, 50, 1e-5, "action", 32),
        "sft_webshop": (375, 15, 1e-5, "action", 32),
        "sr_alfworld": (4200, 50, 1e-5, "think-action", 32),
        "sr_webshop": (750, 15, 1e-5, "think-action", 32),
    }


def test_envrl_recipes_differ_from_grpo_only_in_the_auxiliary_losses(tiny_checkpoint: Path, tmp_path: Path) -> None:
    for env in ENVS:
        grpo = resolve(GPU_CONFIGS / f"grpo_{env}.yaml", tiny_checkpoint, tmp_path / "run", None).to_dict()
        envrl = resolve(GPU_CONFIGS / f"envrl_{env}.yaml", tiny_checkpoint, tmp_path / "run", None).to_dict()
        grpo_algo, envrl_algo = grpo.pop("algorithm"), envrl.pop("algorithm")
        grpo.pop("algo"), envrl.pop("algo")
        assert grpo == envrl
        assert {k: v for k, v in envrl_algo.items() if k in grpo_algo} == grpo_algo


# ---- bad input: refused at start, in one sentence ----------------------------------------------


def _one_sentence(message: str) -> None:
    assert "\n" not in message and message.count(". ") == 0, message


def test_a_model_path_that_does_not_exist_is_refused(data, tmp_path: Path) -> None:
    config = resolve(GPU_CONFIGS / "grpo_alfworld.yaml", Path("/models/Qwen2.5-1.5B-Instruct"), tmp_path / "r", None)
    with pytest.raises(ConfigError) as error:
        preflight(config, mixed_precision="bf16", device="cuda", bf16=True)
    assert str(error.value) == (
        "no checkpoint at /models/Qwen2.5-1.5B-Instruct: --model must name an existing checkpoint folder"
    )
    _one_sentence(str(error.value))
    (tmp_path / "empty").mkdir()
    config.policy.model = str(tmp_path / "empty")
    with pytest.raises(
        ConfigError, match=r"^.*/empty is not a transformers checkpoint folder \(it has no config.json\)$"
    ):
        preflight(config, mixed_precision="no", device="cpu")


def test_a_hub_name_is_refused_when_the_hub_is_offline_and_it_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    config = resolve(GPU_CONFIGS / "grpo_webshop.yaml", Path("Qwen/Qwen2.5-1.5B-Instruct"), tmp_path / "r", None)
    with pytest.raises(ConfigError) as error:
        preflight(config, mixed_precision="bf16", device="cuda", bf16=True)
    assert str(error.value) == (
        "model 'Qwen/Qwen2.5-1.5B-Instruct' is neither a local folder nor in the hub cache, and the hub is "
        "offline: pass --model /path/to/the/checkpoint"
    )


@pytest.mark.parametrize(
    ("precision", "dtype", "device", "bf16", "message"),
    [
        (
            "fp16",
            "float32",
            "cpu",
            False,
            "fp16 mixed precision needs a CUDA GPU but this run trains on cpu: launch with --mixed_precision no (or bf16)",
        ),
        (
            "bf16",
            "float32",
            "cuda",
            False,
            "bf16 mixed precision needs a GPU with bf16 (compute capability 8.0 or later) and this one has none: "
            "launch with --mixed_precision fp16 or no",
        ),
        (
            "no",
            "float16",
            "cpu",
            False,
            "policy.dtype float16 cannot train on cpu: set policy.dtype float32 (or bfloat16)",
        ),
        (
            "no",
            "bfloat16",
            "cuda",
            False,
            "policy.dtype bfloat16 needs a GPU with bf16 and this one has none: set policy.dtype float32",
        ),
        (
            "fp8x",
            "float32",
            "cuda",
            True,
            "mixed precision 'fp8x' is not one the trainer runs with; launch with --mixed_precision no, fp16, bf16",
        ),
        (
            "no",
            "half",
            "cpu",
            False,
            "unknown policy.dtype 'half'; choose one of auto, float32, bfloat16, bf16, float16",
        ),
    ],
)
def test_a_precision_the_device_cannot_run_is_refused(
    precision: str, dtype: str, device: str, bf16: bool, message: str, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    config = resolve(GPU_CONFIGS / "grpo_alfworld.yaml", tiny_checkpoint, tmp_path / "r", None)
    config.policy.dtype = dtype
    with pytest.raises(ConfigError) as error:
        preflight(config, mixed_precision=precision, device=device, bf16=bf16)
    assert str(error.value) == message
    _one_sentence(message)


def test_the_precisions_a_device_can_run_pass() -> None:
    for precision, dtype, device, bf16 in [
        ("no", "float32", "cpu", False),
        ("bf16", "float32", "cpu", False),  # torch autocasts bf16 on CPU
        ("no", "auto", "cpu", False),
        ("bf16", "float32", "cuda", True),
        ("fp16", "float32", "cuda", False),
        ("no", "bfloat16", "cuda", True),
    ]:
        check_precision(precision, dtype, device, bf16=bf16)


def test_auto_dtype_on_cuda_is_the_checkpoints_own() -> None:
    check_precision("no", "auto", "cuda", bf16=False, checkpoint_dtype="float32")
    with pytest.raises(ConfigError) as error:
        check_precision("no", "auto", "cuda", bf16=False, checkpoint_dtype="bfloat16")
    assert str(error.value) == (
        "the checkpoint's dtype bfloat16 (policy.dtype auto) needs a GPU with bf16 and this one has none: "
        "set policy.dtype float32"
    )
    assert re.fullmatch(r"[^\n]+", str(error.value))
