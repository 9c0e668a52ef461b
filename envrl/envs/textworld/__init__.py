"""TextWorld (Côté et al., 2018): games made by TextWorld's own generator, played on its engine.

* ``generate.py``  the task ids, the per-split settings and seeds, and the lazy, cached,
                   verified generation of each game (see its docstring).
* ``env.py``       ``envrl/TextWorld-v0``: plays a game through ``textworld.start``.
"""
