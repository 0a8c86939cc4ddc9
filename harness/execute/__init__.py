"""The execute stage: a plan's runs executed on boxes and recorded so nothing is lost.

``campaign`` makes a campaign directory and executes it; ``fleet`` deals a plan's cohorts to
several boxes (a ``slurm/`` box runs its share as job arrays) and ``sequential`` runs a
sequential design look by look; ``run`` is one box's runner (the lifecycle of a run), composed
of ``guard_steps`` (:mod:`.guards` applied to a campaign) and ``run_records`` (what a run leaves
on disk) over one ``scope``; ``resume``/``reopen`` continue an interrupted or extended campaign
from its journal, ``soak`` samples a long run, ``collect`` boots one cell to gather route counts
and traces, ``preflight`` checks a box. The verbs (``run``, ``box check``, ``collect``) are in
``commands``; what follows a run (analysis, gates, report) is :mod:`harness.spine`'s.
"""
