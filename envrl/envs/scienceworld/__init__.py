"""ScienceWorld (scienceworld==1.2.3) as ``envrl/ScienceWorld-v0``; see ``env.py``."""

from envrl.envs.scienceworld.engine import (
    Engine,
    EngineDiedError,
    EngineJavaError,
    EngineStartError,
    ScienceWorldError,
)

__all__ = ["Engine", "EngineDiedError", "EngineJavaError", "EngineStartError", "ScienceWorldError"]

from envrl.envs.descriptor import ContractTask, EnvDescriptor  # noqa: E402

DESCRIPTORS = (
    EnvDescriptor(
        name="scienceworld",
        env_id="envrl/ScienceWorld-v0",
        entry_point="envrl.envs.scienceworld.env:ScienceWorldEnv",
        max_episode_steps=100,
        split_kinds={"train": "ID", "dev": "ID", "test": "OOD"},
        example_action="look around",
        tool_intro=(
            "You are an agent in a simulated science lab and house. Move between rooms, examine and use objects "
            "and devices, and carry out the experiment the task asks for. Call the act tool with one action at a "
            "time."
        ),
        contract_task=ContractTask(split="dev", task_id="4-2:150", kwargs={"task": "4-2", "java_heap": "256m"}),
        engine_packages=("scienceworld",),
        corpus_tasks=3,
    ),
)
