"""Moved to :mod:`envrl.testing`; this re-export stays until no test imports it by this name."""

from envrl.testing import *  # noqa: F401,F403
from envrl.testing import ENV_ID, MAX_STEPS, SPLITS, FakeAgent, FakeEnv, KwargsAgent, RaisingAgent  # noqa: F401
