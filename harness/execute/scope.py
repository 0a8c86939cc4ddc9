"""What the runner's parts share: the card, the campaign directory, the box and its cohorts.

A :class:`~harness.execute.run.CampaignRunner` (the lifecycle) is composed of
:class:`~harness.execute.guard_steps.Guards` and
:class:`~harness.execute.run_records.Records`, each holding the same :class:`RunnerScope`
rather than inheriting the runner's attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.boxes.base import Box
from harness.card import LoadedCard
from harness.execute.cohorts import CohortBook
from harness.execute.soak import MonitorSettings
from harness.formats.records import CampaignDir
from harness.plan.build import Run
from harness.profiles.box import BoxSpec

ProgressCallback = Callable[[str, Run | None, dict[str, Any]], None]

__all__ = ["ProgressCallback", "RunnerScope"]


@dataclass(frozen=True)
class RunnerScope:
    """One runner's fixed context: set when it starts, never reassigned."""

    loaded: LoadedCard
    campaign: CampaignDir
    box: Box
    box_name: str
    box_spec: BoxSpec
    cohorts: CohortBook  # a fleet's runners share one book (one cohorts.json)
    progress: ProgressCallback
    monitor_settings: MonitorSettings
