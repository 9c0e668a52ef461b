"""Regenerate ALFWorld's receptacle prior (``envrl/agents/grounded/alfworld_prior.json``).

The grounded expert (``expert:search``) orders its search by a prior counted over the initial
states of the built-in ``train`` games. Counting is the agent module's
(:func:`envrl.agents.grounded.alfworld.build_prior`); listing a split's games is the env's
(:func:`envrl.envs.alfworld.env.split_games`). Agents may not import envs, so this script,
outside the package, joins the two::

    env -u ALFWORLD_DATA .venv/bin/python benchmarks/repro/alfworld_prior.py

The built-in split is generated on first use (a few minutes); ``ALFWORLD_DATA`` is not read.
"""

from __future__ import annotations

from typing import Any

from envrl.agents.grounded.alfworld import PRIOR_PATH, build_prior, write_prior
from envrl.envs.alfworld.env import split_games


def train_split_prior(split: str = "train") -> dict[str, Any]:
    """The prior counted over the built-in ``split``'s games, as the shipped file holds it."""
    games = split_games(split, source="builtin")
    return build_prior(
        [game.path for game in games], source=f"initial states of the {len(games)} built-in ALFWorld {split} games"
    )


def main() -> None:
    """Write the prior from the built-in train split beside the agent module."""
    prior = train_split_prior()
    write_prior(prior)
    print(f"wrote {PRIOR_PATH} ({prior['source']})")


if __name__ == "__main__":
    main()
