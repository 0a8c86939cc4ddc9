"""The analysis: a campaign directory's run records → tables, comparisons and seed tables.

``campaign`` reads the directory (verified against its seal) and builds a
:class:`~.campaign.CampaignAnalysis`; ``compare`` turns the run table into mirrored cycles and
hands them to the decision math (:mod:`harness.stats`); ``metrics`` and ``recovery`` compute
per-run figures (speeds, TPOT, T90 from the ring), ``seed_tables``, ``swap_table``,
``recovery_stats`` and ``runtime_tables`` the tables the seeds print, ``fleet`` the per-box
effects, ``looks`` a sequential design's state, ``series`` what the report's figures draw,
``predicted`` a simulation against the box, ``design_cost`` the price of other designs.
"""
