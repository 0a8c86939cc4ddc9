"""How a running runtime takes knob changes: apply and reset by HTTP or a control file (polled, or
read on a signal), washout."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from harness.profiles.base import Strict, _check_regex


class LiveHttp(Strict):
    """A knob change sent as one HTTP request to the running runtime."""

    method: Literal["POST", "PUT", "PATCH"] = Field("POST", description="HTTP method")
    path: str = Field(description="path on the runtime's port, e.g. /admin/knobs")
    body: str = Field(
        "{knobs}",
        description="body template: {knobs} is the settings as a JSON object, {seq} the "
        "change's number; any 2xx answer means applied",
    )


class LiveFile(Strict):
    """A knob change written to a control file the runtime polls, acknowledged in its log."""

    path: str = Field(description="control file template, e.g. {run_dir}/control.json")
    body: str = Field(
        '{"seq": {seq}, "knobs": {knobs}}',
        description="file template: {knobs} is the settings as a JSON object, {seq} the "
        "change's number (it grows with every change of one boot)",
    )
    ack_log_line: str = Field(
        description="regex ({seq} filled in) the runtime logs once the change took effect"
    )
    reject_log_line: str | None = Field(
        None,
        description="regex ({seq} filled in) the runtime logs when it refuses the change; its "
        "first group is the reason",
    )
    timeout_s: float = Field(
        10, gt=0, le=1e5, allow_inf_nan=False, description="no acknowledgement by then: failed"
    )
    interval_s: float = Field(
        0.05, gt=0, le=60, allow_inf_nan=False, description="how often the log is read"
    )
    signal: Literal["HUP", "USR1", "USR2"] | None = Field(
        None,
        description="after the file is in place, send this signal to the runtime's process "
        "group, for a runtime that reads its control file when signalled rather than by "
        "polling; every process of the group gets it, so each must handle it",
    )

    @model_validator(mode="after")
    def _patterns(self) -> LiveFile:
        _check_regex(self.ack_log_line.replace("{seq}", "0"), "ack_log_line")
        if self.reject_log_line is not None:
            _check_regex(self.reject_log_line.replace("{seq}", "0"), "reject_log_line")
        return self


class LiveAction(Strict):
    """One way to reach a running runtime: an HTTP request or a control file."""

    http: LiveHttp | None = Field(None, description="send it as an HTTP request")
    file: LiveFile | None = Field(None, description="write it to a control file the runtime polls")

    @model_validator(mode="after")
    def _exactly_one(self) -> LiveAction:
        if (self.http is None) == (self.file is None):
            raise ValueError("give exactly one of `http` or `file`")
        return self


class LiveContract(Strict):
    """How a running runtime takes knob changes, so cells can share one boot (`design.boot`).

    Knobs with a `live` key, and the file knobs named in `files`, may differ between cells of
    one boot; every other knob, env and arg must be the same.
    """

    apply: LiveAction | None = Field(
        None,
        description="how knob changes reach the runtime (default: POST telemetry.live_knobs_http)",
    )
    reset: LiveAction | None = Field(
        None,
        description="back to the boot state (map reloaded, counters and adaptive state cleared), "
        "sent before each run after the first on a shared boot; the settings ride along",
    )
    files: dict[str, str] = Field(
        default_factory=dict,
        description="file knobs that may change live: name -> key its uploaded path is sent as",
    )
    washout_requests: int = Field(
        0, ge=0, le=100000, description="requests sent and discarded after each change"
    )
    state: str | None = Field(
        None,
        pattern=r"^/",
        description="GET path answering, as one JSON object, the live settings the runtime runs "
        "with (the keys apply and reset send); read after every run, which fails when they "
        "are not the cell's (something else changed the runtime mid-run)",
    )
    washout_s: float = Field(
        0, ge=0, le=1e5, allow_inf_nan=False, description="seconds waited after each change"
    )
