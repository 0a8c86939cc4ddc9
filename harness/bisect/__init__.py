"""``harness bisect``: the first bad build of a history, each step a crossover campaign.

``search`` decides which build comes next and what the calls conclude; ``builds`` resolves and
builds the history; ``run`` runs each step's campaign and calls it; ``report`` writes the
bisect's own report; ``commands`` is the verb.
"""
