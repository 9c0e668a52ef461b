"""The trainers built on GRPO (its rollout, its PPO-clipped update; each subclasses
:class:`~envrl.training.algorithms.grpo.GRPO` and differs in its advantages), by name.

A table of its own, apart from :data:`envrl.training.algorithms.ALGORITHMS` (which lists these
first among the RL trainers), because ENVRL reads it: every trainer here is a valid
``algorithm.base`` of ENVRL. ENVRL is itself in ``ALGORITHMS``, so it could not read that table
without an import cycle. A new trainer of this kind is its file plus one entry here.
"""

from __future__ import annotations

from envrl.training.algorithms.gigpo import GiGPO
from envrl.training.algorithms.grpo import GRPO
from envrl.training.algorithms.rloo import RLOO

#: name -> trainer, in the order ``envrl train --help`` lists them
GRPO_FAMILY: dict[str, type[GRPO]] = {algo.name: algo for algo in (GRPO, GiGPO, RLOO)}
