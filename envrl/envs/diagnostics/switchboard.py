"""``envrl/Diag-Dynamics-v0`` and ``envrl/Diag-Alternatives-v0``: a panel of buttons and lights
whose wiring must be learned from what each press does (docs/diagnostics.md).

A family of ``R`` rules is a panel of R buttons (shapes) and R lights (colours); each button
toggles one light, by a permutation fixed for R (:func:`wiring`), the same on every split. A task
names the lights that are off; the player turns every light on. Each press's observation says
which light it toggled and which are still off, so the wiring is written in every transition.

The two envs share the engine and differ only in which lights a task starts with off:

* Dynamics: ID splits start with 1 to ceil(R/2) lights off (any of them), ``test_ood`` with more.
* Alternatives: ID splits only ever have the first ceil(R/2) lights (in the panel's order) off,
  so an expert only ever presses their buttons; ``test_ood`` has at least one other light off.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache

from envrl.envs.diagnostics.base import DiagnosticEnv, Game, Outcome

SHAPES = ("square", "circle", "star", "moon", "heart", "arrow", "cross", "ring", "bell", "leaf", "key", "crown")
COLOURS = ("red", "amber", "cyan", "green", "violet", "white", "pink", "blue", "gold", "grey", "lime", "teal")
#: presses allowed per rule (light) before the panel locks
PRESSES_PER_RULE = 2
NUMBER_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
)


@dataclass(frozen=True)
class Wiring:
    """The rules of one family: ``buttons[i]`` toggles ``lights[i]``; ``panel`` is the lights'
    order on the panel (the order every text lists them in)."""

    buttons: tuple[str, ...]
    lights: tuple[str, ...]
    panel: tuple[str, ...]

    def button_for(self, light: str) -> str:
        return self.buttons[self.lights.index(light)]

    def light_of(self, button: str) -> str:
        return self.lights[self.buttons.index(button)]


@cache
def wiring(rules: int) -> Wiring:
    """The family's fixed wiring for ``rules`` buttons: shapes, colours and which drives which,
    drawn from a generator seeded with the family alone (so every split shares it)."""
    rng = random.Random(f"rules-{rules}")
    buttons = tuple(rng.sample(SHAPES, rules))
    panel = tuple(rng.sample(COLOURS, rules))
    lights = tuple(rng.sample(panel, rules))
    return Wiring(buttons=buttons, lights=lights, panel=panel)


def press_action(button: str) -> str:
    return f"press the {button} button"


class PanelGame(Game):
    out_of_moves = "The panel locks."

    def __init__(self, wires: Wiring, off: Collection[str]):
        self.wires = wires
        self.off = set(off)
        self.most_off = len(self.off)

    def _still_off(self) -> str:
        off = [light for light in self.wires.panel if light in self.off]
        return f"Lights still off: {', '.join(off)}." if off else "All lights are on."

    def observation(self) -> str:
        count = NUMBER_WORDS[len(self.wires.buttons)]
        return (
            f"A panel with {count} buttons ({', '.join(self.wires.buttons)}) and {count} lights "
            f"({', '.join(self.wires.panel)}). {self._still_off()}"
        )

    def actions(self) -> list[str]:
        return [press_action(button) for button in self.wires.buttons]

    def play(self, action: str) -> Outcome:
        button = action.removeprefix("press the ").removesuffix(" button")
        light = self.wires.light_of(button)
        turned = "on" if light in self.off else "off"
        self.off ^= {light}
        text = f"You press the {button} button. The {light} light turns {turned}. {self._still_off()}"
        if not self.off:
            return Outcome(f"{text} The panel hums: every light is on.", reward=1.0, won=True)
        return Outcome(text)

    def expert_plan(self) -> list[str]:
        return [press_action(self.wires.button_for(light)) for light in self.wires.panel if light in self.off]

    def progress(self) -> float:
        return 1.0 - len(self.off) / max(self.most_off, 1)

    def random_success(self, moves: int) -> float:
        return panel_random_success(len(self.wires.buttons), len(self.off), moves)


class _PanelEnv(DiagnosticEnv):
    """The shared engine: subclasses choose which lights a task starts with off."""

    knob = "rules"
    knob_range = (2, 12)

    def narrow(self) -> int:
        """ceil(R/2): the size of the in-distribution part."""
        return (self.value + 1) // 2

    def off_lights(self, rng: random.Random, panel: Sequence[str], ood: bool) -> list[str]:
        raise NotImplementedError

    def new_game(self, rng: random.Random, ood: bool) -> tuple[PanelGame, str]:
        wires = wiring(self.value)
        return PanelGame(wires, self.off_lights(rng, wires.panel, ood)), "Turn on every light on the panel."

    def move_budget(self, game: Game, ood: bool) -> int:
        return PRESSES_PER_RULE * self.value


class DynamicsEnv(_PanelEnv):
    """The panel with ``rules`` buttons; ID tasks start with 1..ceil(R/2) lights off, OOD with more."""

    task_type = "dynamics"

    def __init__(self, split: str = "train", rules: int = 4, expert_plan: bool = False, render_mode: str | None = None):
        super().__init__(split, rules, expert_plan=expert_plan, render_mode=render_mode)

    def off_lights(self, rng: random.Random, panel: Sequence[str], ood: bool) -> list[str]:
        low, high = (self.narrow() + 1, self.value) if ood else (1, self.narrow())
        return rng.sample(list(panel), rng.randint(low, high))


class AlternativesEnv(_PanelEnv):
    """The panel with ``rules`` buttons; ID tasks only ever have the first ceil(R/2) lights off,
    OOD tasks at least one of the others (and any of the first ones)."""

    task_type = "alternatives"

    def __init__(self, split: str = "train", rules: int = 6, expert_plan: bool = False, render_mode: str | None = None):
        super().__init__(split, rules, expert_plan=expert_plan, render_mode=render_mode)

    def off_lights(self, rng: random.Random, panel: Sequence[str], ood: bool) -> list[str]:
        narrow, others = list(panel[: self.narrow()]), list(panel[self.narrow() :])
        if not ood:
            return rng.sample(narrow, rng.randint(1, len(narrow)))
        return rng.sample(others, rng.randint(1, len(others))) + rng.sample(narrow, rng.randint(0, len(narrow)))


def panel_random_success(rules: int, off: int, presses: int | None = None) -> float:
    """The exact chance that uniformly random presses turn every light on, from ``off`` lights
    off, within ``presses`` (default the env's budget): a press turns one of the ``off`` lights
    on with probability off/R, else one more light off (an Ehrenfest chain absorbed at 0)."""
    budget = PRESSES_PER_RULE * rules if presses is None else presses

    @cache
    def win(off_now: int, left: int) -> float:
        if off_now == 0:
            return 1.0
        if left == 0:
            return 0.0
        down = off_now / rules
        return down * win(off_now - 1, left - 1) + (1 - down) * win(off_now + 1, left - 1)

    return win(off, budget)
