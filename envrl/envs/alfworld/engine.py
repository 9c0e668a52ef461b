"""The ALFWorld text engine: TextWorld's PDDL environment, made fast without changing a byte.

``AlfredEngine`` is the stock engine (``textworld.envs.pddl.PddlEnv``) with its two costs taken
out of the step and the reset, each in its own module:

* text generation (~95% of a stock step) and grammar-file parsing (on every ``load()``):
  ``grammar`` (``CachedGrammar``, ``game_logic``) derives the same strings from parses made
  once per text;
* Fast Downward's two translations of the problem to SAS (~3/4 of a stock reset): ``translations``
  (``TranslationCache``) makes each once and keeps it in memory and on disk.
  ``TranslatedPddlState`` builds the game state from a cached translation, and hands the
  planner's to Fast Downward only when the planner first runs.

This module also holds the command wording (``move X to Y`` or ``put X in/on Y``), ALFWorld's own
wrappers and its hand-coded expert, with its drift bug fixed.

``tests/test_alfworld_engine.py`` replays walkthroughs in both engines and compares every
observation and admissible-command list byte for byte; ``tests/test_alfworld_reset.py``
checks that cached, uncached and stock resets agree and that the cache survives damage.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import textworld
import textworld.logic
from textworld.core import EnvInfos, GameState
from textworld.envs.pddl import pddl as stock_pddl
from textworld.logic import Proposition

from envrl.envs.alfworld.grammar import game_logic
from envrl.envs.alfworld.translations import (
    PlannerTranslation,
    StateTranslation,
    TranslationCache,
    default_translations,
)

# ALFWorld 0.4.x says "move X to Y"; many published prompts use the older "put X in/on Y".
MOVE_TEMPLATE = 'template :: "move {o} to {r}";'
PUT_TEMPLATE = 'template :: "put {o} in/on {r}";'
COMMAND_STYLES = ("move", "put")


class TranslatedPddlState(stock_pddl.pddl_logic.PddlState):
    """``PddlState`` built from cached translations instead of calling the translator.

    It sets up the same facts, types and native state as the stock constructor. The planner's
    SAS is handed to Fast Downward just before the first ``replan`` (``load_sas_replan`` only
    stores the text that ``replan`` reads), so games that are never planned never need it.
    """

    def __init__(
        self,
        downward_lib: Any,
        pddl_problem: str,
        logic: Any,
        translation: StateTranslation,
        planner: Callable[[], PlannerTranslation],
    ) -> None:
        # the same attributes the stock constructor sets (PddlState's own methods read them)
        self._facts: defaultdict[str, set[Proposition]] = defaultdict(set)
        self._vars_by_name: dict[str, Any] = {}
        self._vars_by_type: defaultdict[str, set[Any]] = defaultdict(set)
        self._var_counts: Counter[str] = Counter()
        self._logic = logic
        self.downward_lib = downward_lib
        self.pddl_problem = pddl_problem
        self.task = None  # the translator's parsed task is not kept; see StateTranslation
        self.sas = translation.sas
        self._planner = planner
        self._planner_loaded = False
        self._actions = translation.action_schemas
        for name, parents in translation.types:
            with contextlib.suppress(ValueError):  # already known to this logic
                logic.types.add(textworld.logic.Type(name, list(parents)))
        downward_lib.load_sas(translation.sas.encode("utf-8"))
        self.name2type = dict(translation.objects)
        self.add_facts(translation.facts)
        self.add_facts(translation.native_facts(self._native_facts))

    def _native_facts(self) -> list[Proposition]:
        """The facts of the native engine's current state (its negated atoms left out)."""
        atoms = (stock_pddl.pddl_logic.Atom * self.downward_lib.get_state_size())()
        self.downward_lib.get_state(atoms)
        facts = [atom.get_fact(self.name2type) for atom in atoms]
        return [fact for fact in facts if not fact.is_negation]

    @property
    def sas_replan(self) -> str:
        """The planner's SAS, translated (or read from the cache) on first use."""
        return self._planner().sas

    def replan(self, infos: Any) -> list[str]:
        """``PddlState.replan``, after handing this game's planner SAS to Fast Downward once."""
        if not self._planner_loaded:
            self.downward_lib.load_sas_replan(self.sas_replan.encode("utf-8"))
            self._planner_loaded = True
        return super().replan(infos)


class AlfredEngine(stock_pddl.PddlEnv):
    """``PddlEnv`` with the cached grammar, parsed logic and translations.

    ``translations``: where translations come from (default: the process-wide cache).
    """

    def __init__(self, infos: EnvInfos | None = None, translations: TranslationCache | None = None) -> None:
        super().__init__(infos)
        self.translations = translations or default_translations()
        self._fresh_state = False

    def load(self, filename_or_data: str | os.PathLike | Mapping[str, Any]) -> None:
        # PddlEnv.load, with the grammar parse and the translation looked up instead of redone.
        if isinstance(filename_or_data, Mapping):
            data, self._game_file = filename_or_data, None
        else:
            with open(filename_or_data, encoding="utf-8") as handle:
                data = json.load(handle)
            self._game_file = filename_or_data
        self._game_data = data
        self.walkthrough = data.get("walkthrough", None)
        self._logic = game_logic(data["pddl_domain"], data["grammar"])
        self._pddl_state = self._initial_state()
        self._entity_infos = self._get_entity_infos()
        self._fresh_state = True

    def _initial_state(self) -> TranslatedPddlState:
        domain, problem = self._logic.domain, self._game_data["pddl_problem"]
        translations = self.translations
        return TranslatedPddlState(
            self.downward_lib,
            problem,
            self._logic,
            translations.state(domain, problem),
            planner=lambda: translations.planner(domain, problem),
        )

    def reset(self) -> GameState:
        # PddlEnv.reset, except that right after load() the state just built is used as is.
        if not self._fresh_state:
            self._pddl_state = self._initial_state()
        self._fresh_state = False
        self.prev_state = None
        self.state = GameState()
        self._last_action = None
        self._moves = 0
        context = {
            "state": self._pddl_state,
            "facts": list(self._pddl_state.facts),
            "variables": {},
            "mapping": {},
            "entity_infos": self._entity_infos,
        }
        self.state.feedback = self._logic.grammar.derive("#intro#", context)
        self.state.raw = self.state.feedback
        self._gather_infos()
        if "walkthrough" in self.request_infos.extras:
            self.state["extra.walkthrough"] = self.walkthrough or self._pddl_state.replan(self._entity_infos)
        return self.state

    def step(self, command: str):
        self._fresh_state = False
        return super().step(command)

    def replan(self) -> list[str]:
        """The planner's actions from the current state to the goal (empty if it finds none).

        The stock engine answers this only inside its info gathering; the env asks again
        after each action the agent took off the plan, without reading the engine's state.
        """
        return self._pddl_state.replan(self._entity_infos) or []


def with_command_style(game: dict[str, Any], style: str) -> dict[str, Any]:
    """A copy of an ALFWorld game whose put command reads in ``style`` ("move" or "put")."""
    if style not in COMMAND_STYLES:
        raise ValueError(f"command_style must be one of {COMMAND_STYLES}, got {style!r}")
    if style == "move":
        return game
    game = dict(game)
    game["grammar"] = game["grammar"].replace(MOVE_TEMPLATE, PUT_TEMPLATE)
    game["walkthrough"] = [translate_command(a, "put") for a in game.get("walkthrough") or []]
    return game


def translate_command(command: str, style: str) -> str:
    """``move X to Y`` <-> ``put X in/on Y`` so that walkthroughs follow the chosen wording."""
    if style == "put" and command.startswith("move ") and " to " in command:
        obj, _, recep = command[len("move ") :].partition(" to ")
        return f"put {obj} in/on {recep}"
    if style == "move" and command.startswith("put ") and " in/on " in command:
        obj, _, recep = command[len("put ") :].partition(" in/on ")
        return f"move {obj} to {recep}"
    return command


@contextlib.contextmanager
def alfworld_import_guard() -> Iterator[None]:
    """Import ``alfworld`` modules without letting them change ``ALFWORLD_DATA``.

    ``alfworld.info`` creates ``$ALFWORLD_DATA`` (default ``~/.cache/alfworld``) and exports it
    into ``os.environ`` when first imported. envrl reads that variable to choose between official
    and built-in games, so an import must not flip the choice for the rest of the process.
    """
    saved = os.environ.get("ALFWORLD_DATA")
    if saved is None:
        os.environ["ALFWORLD_DATA"] = os.path.join(tempfile.gettempdir(), "envrl-alfworld-import")
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("ALFWORLD_DATA", None)
        else:
            os.environ["ALFWORLD_DATA"] = saved


def alfred_wrappers() -> list:
    """ALFWorld's own TextWorld wrappers: readable names ("desk 1") and the game-file info."""
    with alfworld_import_guard():
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    return [AlfredDemangler(shuffle=False), AlfredInfos]


def handcoded_expert_wrapper(env: Any) -> Any:
    """Wrap ``env`` in ALFWorld's hand-coded expert, with its drift bug fixed.

    ALFWorld 0.4's hand-coded expert tracks its inventory by looking for ``put`` in the last
    command, but the 0.4 grammar says ``move X to Y``: after its first placement it still
    believes it holds the object, so ``pick_two_obj_and_place`` never finishes. The fix
    reports placements to the expert in the wording it understands. It also reads (and
    writes) admissible commands in the ``move`` wording only, so under ``command_style="put"``
    it is shown the commands in that wording; the env translates its plan back.
    """
    with alfworld_import_guard():
        from alfworld.agents.environment.alfred_tw_env import AlfredExpert, AlfredExpertType

    class HandCodedExpert(AlfredExpert):
        def step(self, command: str):
            self.state, reward, done = textworld.core.Wrapper.step(self, command)
            self.prev_command = translate_command(str(command).strip(), "put")
            self._gather_infos()
            return self.state, reward, done

        def _gather_infos(self) -> None:
            shown = self.state["admissible_commands"]
            self.state["admissible_commands"] = [translate_command(c, "move") for c in shown]
            try:
                super()._gather_infos()
            finally:
                self.state["admissible_commands"] = shown

    return HandCodedExpert(env, expert_type=AlfredExpertType.HANDCODED)


def start_engine(
    infos: EnvInfos, stock: bool = False, translations: TranslationCache | None = None
) -> textworld.Environment:
    """An unloaded ALFWorld engine (envrl's, or the stock one for comparisons).

    ``translations``: envrl's engine takes its translations from there (default: the
    process-wide cache).
    """
    env: Any = stock_pddl.PddlEnv(infos) if stock else AlfredEngine(infos, translations)
    for wrapper in alfred_wrappers():
        env = wrapper(env)
    return env
