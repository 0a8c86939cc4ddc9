"""Campaign cards: the YAML a user writes, validated into a :class:`Card`.

Validation is two passes. The schema pass (pydantic, ``extra="forbid"``; :mod:`.schema`, errors
placed by :mod:`.locate`) checks shapes and types; the semantic pass (:mod:`.checks`) checks what
needs the card as a whole or the disk: the control is a cell, files exist, metrics and counters
are known, phases name domains the pools have, and the held-out set shares no prompt with the fit
set. Every problem is reported at once, as ``file:line: path: message``. Box and runtime names
resolve through :mod:`.resolve`; :mod:`.load` ties it together, reading files where a
:class:`~.inputs.Locator` says (beside the card, or a campaign directory's frozen copies,
:mod:`.frozen`).
"""

from harness.card.checks import display_path
from harness.card.inputs import InputFile, Locator
from harness.card.load import (
    LoadedCard,
    load_card,
    read_card_schema,
    scale_workload,
    validate_card,
)
from harness.card.resolve import (
    PACKAGE_DATA,
    find_runtime_profile,
    known_runtime_names,
    load_boxes,
    load_boxes_file,
    load_runtime_profile,
    search_path,
)
from harness.card.schema import (
    CONFIRMABLE_KINDS,
    GATE_KINDS,
    AnalysisSpec,
    BetterGate,
    CacheState,
    Card,
    Cell,
    ConfirmSpec,
    CounterGate,
    Design,
    ExactOutputsGate,
    Gate,
    KnobValue,
    LockstepGate,
    Phase,
    PromptsSpec,
    QualityGate,
    RegressionGate,
    SoakGate,
    Split,
    SurvivesGate,
    Workload,
    parse_fraction,
)
from harness.catalog import CACHE_STATES

__all__ = [
    "CACHE_STATES",
    "CONFIRMABLE_KINDS",
    "GATE_KINDS",
    "PACKAGE_DATA",
    "AnalysisSpec",
    "BetterGate",
    "CacheState",
    "Card",
    "Cell",
    "ConfirmSpec",
    "CounterGate",
    "Design",
    "ExactOutputsGate",
    "Gate",
    "InputFile",
    "KnobValue",
    "LoadedCard",
    "Locator",
    "LockstepGate",
    "Phase",
    "PromptsSpec",
    "QualityGate",
    "RegressionGate",
    "SoakGate",
    "Split",
    "SurvivesGate",
    "Workload",
    "display_path",
    "find_runtime_profile",
    "known_runtime_names",
    "load_boxes",
    "load_boxes_file",
    "load_card",
    "load_runtime_profile",
    "parse_fraction",
    "read_card_schema",
    "scale_workload",
    "search_path",
    "validate_card",
]
