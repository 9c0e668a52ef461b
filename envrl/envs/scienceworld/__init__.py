"""ScienceWorld (scienceworld==1.2.3) as ``envrl/ScienceWorld-v0``; see ``env.py``."""

from envrl.envs.scienceworld.engine import (
    Engine,
    EngineDiedError,
    EngineJavaError,
    EngineStartError,
    ScienceWorldError,
)

__all__ = ["Engine", "EngineDiedError", "EngineJavaError", "EngineStartError", "ScienceWorldError"]
