"""ALFWorld (Shridhar et al., 2021) as ``envrl/ALFWorld-v0``; see ``env.py``."""

from envrl.envs.descriptor import ContractTask, EnvDescriptor

DESCRIPTORS = (
    EnvDescriptor(
        name="alfworld",
        env_id="envrl/ALFWorld-v0",
        entry_point="envrl.envs.alfworld.env:ALFWorldEnv",
        max_episode_steps=50,
        split_kinds={"train": "ID", "valid_seen": "ID", "valid_unseen": "OOD", "ood_objects": "OOD"},
        example_action="go to cabinet 1",
        tool_intro=(
            "You are a household robot in a simulated room. Move to receptacles, open and close them, pick up, "
            "heat, cool, clean, slice and place objects to complete the task. Call the act tool with one action "
            "at a time."
        ),
        contract_task=ContractTask(split="valid_seen", fixtures=("with_official_data",)),
        # loading a game parses its logic with TextWorld's one process-wide tatsu parser
        single_thread=True,
        engine_packages=("alfworld", "textworld"),
        downloader="envrl.envs.alfworld.official",
        corpus_tasks=12,
        default_corpus_position=1,
    ),
)
