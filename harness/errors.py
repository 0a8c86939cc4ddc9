"""The one error hierarchy of the harness.

Expected failures raise a subclass of :class:`HarnessError`; the CLI prints them without a
traceback and maps each family to an exit code (2 bad input, 3 infrastructure). A failed gate
is a verdict, not an error: the command returns 1 (``EXIT_GATE_FAILED``) itself.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INFRASTRUCTURE = 3


class HarnessError(Exception):
    """Base of every expected failure; carries the exit code the CLI should use."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.problems = problems or []

    def lines(self) -> list[str]:
        """The lines the CLI prints: every problem, or the message alone."""
        return self.problems or [self.message]


class BadInput(HarnessError):
    """Input the user can fix: a card, a knob, a trace, a ring or a data file."""


class CardError(BadInput):
    """A campaign card failed validation; ``problems`` holds one ``file:line: path: msg`` each."""


class PlanError(BadInput):
    """A valid card cannot be expanded into a plan."""


class RingError(BadInput):
    """A telemetry ring file is malformed, truncated or torn."""


class TraceError(BadInput):
    """A routing trace has the wrong shape, expert ids out of range or mixed top-k."""


class MapError(BadInput):
    """A rowmap, hotlist or counter dump is malformed."""


class KnobError(BadInput):
    """A runtime knob has an invalid value."""


class RecordError(BadInput):
    """A campaign directory or run record is missing or unreadable."""


class ResultFileError(BadInput):
    """Another tool's results file (vLLM, llama-bench, ds4-bench…) is of the wrong format or
    lacks a field the import needs."""


class InfrastructureError(HarnessError):
    """Something outside the user's input failed: a box, a boot, a connection."""

    exit_code = EXIT_INFRASTRUCTURE


class BoxError(InfrastructureError):
    """A box could not be reached or a command on it failed."""


class SlurmError(BoxError):
    """A Slurm cluster refused a job, could not be asked about one, or lost one."""


class RuntimeBootError(InfrastructureError):
    """A runtime did not boot or never became ready."""


class VerificationError(InfrastructureError):
    """A campaign directory does not hold what its journal sealed (:mod:`harness.formats.verify`).

    Exit 3, not 2: the records were changed after they were written (a bad copy, a disk, a hand
    edit), and no verdict may be read from them; nothing the user passed was wrong.
    """

    def __init__(self, problem: str) -> None:
        super().__init__(f"campaign directory does not verify: {problem}")
