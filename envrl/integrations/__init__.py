"""envrl's environments inside other projects' trainers: one module per ecosystem (``trl``, ``openenv``,
``verifiers``), each importing its library only when it is imported itself, so that ``import envrl`` never
pulls in a trainer. Each module checks the installed library's version and names the extra to install
(``pip install 'envrl[trl]'``) when it is missing.
"""
