"""Checks a training run can start on this machine, made before any weights are loaded.

A GPU recipe (``benchmarks/configs/gpu``) that names a model folder that is not there, or a
precision the device cannot run, would otherwise fail minutes into a run, deep inside
transformers or accelerate, with a traceback instead of a sentence; on a lent GPU those minutes
are the scarce thing. :func:`preflight` refuses such a run at once with one sentence
(:class:`~envrl.training.config.ConfigError`, which ``envrl train`` prints as its error).

What it checks:

* the model: a local path must be a transformers checkpoint folder (``config.json``); a hub name
  must be in the local hub cache when the hub is off (``HF_HUB_OFFLINE`` or
  ``TRANSFORMERS_OFFLINE``), since nothing could download it;
* the launcher's mixed precision (``ACCELERATE_MIXED_PRECISION``, which ``accelerate launch
  --mixed_precision`` sets and :class:`~envrl.training.loop.Trainer` reads): fp16 needs a CUDA
  device (its gradient scaler and kernels are CUDA's), bf16 on CUDA needs a GPU with bf16
  (compute capability 8.0 or later); bf16 on CPU is allowed (torch autocasts it there);
* ``policy.dtype`` (the weights' dtype): a known name, float16 not on CPU, bfloat16 only on a
  device that has it; ``auto`` on CUDA takes the checkpoint's own dtype, checked the same way.

The device is the one the trainer picks: ``policy.device``, or CUDA when there is one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from envrl.training.config import ConfigError

#: ``policy.dtype`` names and the precision each stands for (as policy.py reads them)
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16"}
#: ``accelerate launch --mixed_precision`` values the trainer runs with
MIXED_PRECISIONS = ("no", "fp16", "bf16")
#: a checkpoint's ``torch_dtype`` / ``dtype`` in ``config.json`` and its precision
_CHECKPOINT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def is_local_path(model: str) -> bool:
    """Whether ``model`` is meant as a folder on disk (what policy.py treats as one), not a hub name."""
    return model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().exists()


def hub_offline() -> bool:
    """Whether the hub is switched off for this process (nothing can be downloaded)."""
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in _OFFLINE_VARS)


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def check_model(model: str) -> None:
    """ConfigError (one sentence) unless ``model`` is a checkpoint folder, or a hub name that can be had."""
    if not model:
        raise ConfigError("no model: set --model PATH (a checkpoint folder, e.g. one made by `envrl model init`)")
    if is_local_path(model):
        path = Path(model).expanduser()
        if not path.exists():
            raise ConfigError(f"no checkpoint at {model}: --model must name an existing checkpoint folder")
        if not (path / "config.json").is_file():
            raise ConfigError(f"{model} is not a transformers checkpoint folder (it has no config.json)")
        return
    if hub_offline() and _cached_config(model) is None:
        raise ConfigError(
            f"model {model!r} is neither a local folder nor in the hub cache, and the hub is offline: "
            "pass --model /path/to/the/checkpoint"
        )


def _cached_config(repo_id: str) -> str | None:
    """The cached ``config.json`` of hub model ``repo_id``, None when it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # a name the hub could never hold (e.g. two slashes)
        return None
    return found if isinstance(found, str) else None


def training_device(config: Any) -> str:
    """``cuda`` or ``cpu``: the device :class:`~envrl.training.loop.Trainer` trains on for ``config``."""
    import torch

    wanted = str(config.policy.device)
    if wanted == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return "cuda"


def cuda_has_bf16() -> bool:
    """Whether the current CUDA device computes in bf16 natively (compute capability >= 8.0)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False))


def check_precision(
    mixed_precision: str, dtype: str, device: str, *, bf16: bool | None = None, checkpoint_dtype: str | None = None
) -> None:
    """ConfigError (one sentence) when ``device`` (``cpu`` or ``cuda``) cannot train with the launcher's
    ``mixed_precision`` or weights of ``dtype``; ``bf16`` says whether the GPU has bf16 (default: ask
    torch), ``checkpoint_dtype`` is the checkpoint's own (for ``dtype: auto`` on CUDA)."""
    if mixed_precision not in MIXED_PRECISIONS:
        raise ConfigError(
            f"mixed precision {mixed_precision!r} is not one the trainer runs with; "
            f"launch with --mixed_precision {', '.join(MIXED_PRECISIONS)}"
        )
    if dtype != "auto" and dtype not in DTYPES:
        raise ConfigError(f"unknown policy.dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}")
    cuda_bf16 = (cuda_has_bf16() if bf16 is None else bf16) if device == "cuda" else False
    if mixed_precision == "fp16" and device != "cuda":
        raise ConfigError(
            f"fp16 mixed precision needs a CUDA GPU but this run trains on {device}: "
            "launch with --mixed_precision no (or bf16)"
        )
    if mixed_precision == "bf16" and device == "cuda" and not cuda_bf16:
        raise ConfigError(
            "bf16 mixed precision needs a GPU with bf16 (compute capability 8.0 or later) and this one has none: "
            "launch with --mixed_precision fp16 or no"
        )
    weights = DTYPES.get(dtype)
    source = f"policy.dtype {dtype}"
    if dtype == "auto":
        # auto is float32 on CPU (policy.py) and the checkpoint's own dtype on CUDA
        weights = _CHECKPOINT_DTYPES.get(checkpoint_dtype or "", "fp32") if device == "cuda" else "fp32"
        source = f"the checkpoint's dtype {checkpoint_dtype} (policy.dtype auto)"
    if weights == "fp16" and device != "cuda":
        raise ConfigError(f"{source} cannot train on {device}: set policy.dtype float32 (or bfloat16)")
    if weights == "bf16" and device == "cuda" and not cuda_bf16:
        raise ConfigError(f"{source} needs a GPU with bf16 and this one has none: set policy.dtype float32")


def checkpoint_dtype(model: str) -> str | None:
    """The dtype a local checkpoint's ``config.json`` records (``torch_dtype`` or ``dtype``), if any."""
    if not is_local_path(model):
        return None
    path = Path(model).expanduser() / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = data.get("dtype") or data.get("torch_dtype")
    return str(value) if value else None


def preflight(
    config: Any, *, mixed_precision: str | None = None, device: str | None = None, bf16: bool | None = None
) -> None:
    """Refuse (ConfigError, one sentence) a run of ``config`` that cannot start here (module docstring).

    ``mixed_precision`` defaults to the launcher's (``ACCELERATE_MIXED_PRECISION``, else ``no``),
    ``device`` to the trainer's choice, ``bf16`` to what torch says of the GPU; tests pass them."""
    check_model(config.policy.model)
    precision = mixed_precision if mixed_precision is not None else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    where = device if device is not None else training_device(config)
    check_precision(
        precision.strip().lower(),
        str(config.policy.dtype),
        where,
        bf16=bf16,
        checkpoint_dtype=checkpoint_dtype(config.policy.model),
    )
