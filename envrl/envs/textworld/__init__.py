"""TextWorld (Côté et al., 2018): games made by TextWorld's own generator, played on its engine.

* ``generate.py``  the task ids, the per-split settings and seeds, and the lazy, cached,
                   verified generation of each game (see its docstring).
* ``env.py``       ``envrl/TextWorld-v0``: plays a game through ``textworld.start``.
"""

from envrl.envs.descriptor import ContractTask, EnvDescriptor

DESCRIPTORS = (
    EnvDescriptor(
        name="textworld",
        env_id="envrl/TextWorld-v0",
        entry_point="envrl.envs.textworld.env:TextWorldEnv",
        max_episode_steps=50,
        split_kinds={"train": "ID", "select": "ID", "valid": "ID", "test_ood": "OOD"},
        example_action="go north",
        tool_intro=(
            "You are playing a text adventure. Explore the rooms, use what you find, and complete the objective. "
            "Call the act tool with one command at a time."
        ),
        contract_task=ContractTask(
            split="train", task_id="tw-custom:train:0", fixture_kwargs={"cache_dir": "tw_cache"}
        ),
        # two TextWorld resets on two threads failed inside its tatsu parser ("pop from empty list")
        single_thread=True,
        engine_packages=("textworld",),
        # TextWorld generates each game on first use (2-4 s), so the tokenizer corpus plays few
        corpus_tasks=6,
        default_corpus_position=0,
    ),
)
