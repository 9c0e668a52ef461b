"""The algorithms ``envrl train --algo NAME`` can run, by name."""

from __future__ import annotations

from envrl.training.algorithms.base import Algorithm, Batch
from envrl.training.algorithms.envrl import ENVRL, ENVRLConfig
from envrl.training.algorithms.gigpo import GiGPO, GiGPOConfig
from envrl.training.algorithms.grpo import GRPO, GRPOConfig
from envrl.training.algorithms.grpo_family import GRPO_FAMILY
from envrl.training.algorithms.iwm import IWM, IWMConfig
from envrl.training.algorithms.rloo import RLOO, RLOOConfig
from envrl.training.algorithms.sft import SFT, SFTConfig
from envrl.training.algorithms.sr import SR, SRConfig
from envrl.training.config import ConfigError

#: every trainer by name; the GRPO-based ones (ENVRL's possible bases) come from their own table
ALGORITHMS: dict[str, type[Algorithm]] = {SFT.name: SFT, **GRPO_FAMILY, IWM.name: IWM, SR.name: SR, ENVRL.name: ENVRL}


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm called ``name``; a ConfigError lists the known ones."""
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Batch",
    "ENVRL",
    "ENVRLConfig",
    "GRPO",
    "GRPOConfig",
    "GRPO_FAMILY",
    "GiGPO",
    "GiGPOConfig",
    "IWM",
    "IWMConfig",
    "RLOO",
    "RLOOConfig",
    "SFT",
    "SFTConfig",
    "SR",
    "SRConfig",
    "algorithm_class",
]
