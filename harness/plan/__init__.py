"""The plan: a card's cells, cycles and cache states as an ordered list of runs, with estimates.

:mod:`.build` orders the runs; :mod:`.commands` holds the ``validate`` and ``plan`` verbs.
"""
