"""Checkpoints: exact resumption, and plain transformers folders for evaluation.

An output folder holds::

    config.yaml              the resolved configuration (a resumed run must have the same,
                             except ``updates`` may grow: see :func:`check_output`)
    metrics.jsonl            one line per update
    checkpoints/update-000N/
        model/               save_pretrained + tokenizer: `envrl eval --agent hf:.../model` loads it
        state/               accelerate's save_state: weights, optimizer, scheduler, RNG states
        trainer.json         the update reached

Resuming loads the latest ``state/`` (so weights, AdamW moments, the learning-rate schedule and
every RNG continue where they were) and goes on from the next update; rollouts and data order
are functions of (seed, update), so a resumed CPU run repeats the uninterrupted one bit for bit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from envrl.training.config import ConfigError, TrainConfig, differences

_CHECKPOINT = re.compile(r"update-(\d+)")


def checkpoint_dir(out: Path, update: int) -> Path:
    return out / "checkpoints" / f"update-{update:06d}"


def latest_checkpoint(out: Path) -> tuple[int, Path] | None:
    """The highest update with a complete resume state in ``out``, if any."""
    found = []
    for path in (out / "checkpoints").glob("update-*"):
        match = _CHECKPOINT.fullmatch(path.name)
        if match and (path / "trainer.json").is_file():
            found.append((int(match.group(1)), path))
    return max(found) if found else None


def check_output(out: Path, config: TrainConfig, extendable: bool = False) -> None:
    """Write ``config.yaml``, or check that the one there is this run's (resuming).

    ``extendable``: nothing the run did so far depends on its total number of updates (a constant
    learning rate, no schedule over the run in the algorithm), so a run may be continued to more
    ``updates`` than it was started with: rollouts and data order are functions of (seed, update),
    so the continued run is the run that would have been started with the larger total."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    current = _plain(config.to_dict())
    if path.is_file():
        saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        changed = differences(saved, current)
        if changed == ["updates"]:
            before = int(saved["updates"])
            if config.updates < before:
                raise ConfigError(
                    f"{out} holds a run of {before} updates; updates={config.updates} would not shorten it: "
                    "evaluate the checkpoint of that update instead (checkpoints/update-N/model)"
                )
            if not extendable:
                raise ConfigError(
                    f"{out} holds a run of {before} updates whose schedule spans the run (optim.schedule, or "
                    "the algorithm's own); it cannot be continued to more: use a new --out"
                )
        elif changed:
            raise ConfigError(
                f"{out} holds a run with another configuration (differs in: {', '.join(changed)}); "
                "use a new --out, or the same configuration to resume it"
            )
        else:
            return
    path.write_text(yaml.safe_dump(current, sort_keys=False), encoding="utf-8")


def save_state(trainer: Any, update: int) -> Path:
    """Everything needed to resume after ``update`` updates (and a model folder for evaluation)."""
    directory = checkpoint_dir(trainer.out, update)
    trainer.accelerator.save_state(str(directory / "state"))
    if trainer.accelerator.is_main_process:
        trainer.policy.save(directory / "model")
        (directory / "trainer.json").write_text(json.dumps({"update": update}), encoding="utf-8")
    trainer.accelerator.wait_for_everyone()
    return directory


def load_state(trainer: Any, directory: Path) -> int:
    """Restore the state saved in ``directory``; returns the update it had reached."""
    trainer.accelerator.load_state(str(directory / "state"))
    return int(json.loads((directory / "trainer.json").read_text(encoding="utf-8"))["update"])


def _plain(value: Any) -> Any:
    """A YAML-safe copy (tuples as lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
