"""Counters from a runtime's JSON counters or Prometheus ``/metrics``, and per-request timings.

llama-server (with ``--metrics``) serves ``llamacpp:prompt_tokens_total`` and friends as Prometheus
text; the executor scrapes it before and after each run, like a JSON counters endpoint, and the
delta is the run's. Samples keep their Prometheus names (labels included, as written), so nothing
is renamed on the way and a counter reads the same here as in the runtime's own docs.

The final streamed chunk of a llama-server completion carries ``timings`` (the server's own prompt
and decode clocks); :func:`timings_columns` flattens it into request columns, so client-side and
server-side decode speeds can be set side by side.
"""

from __future__ import annotations

import math
import re
import urllib.error
from collections.abc import Mapping
from typing import Any

from harness.errors import BadInput
from harness.runtimes.boot import http_json, http_text

# name{labels} value [timestamp]; names may hold ':' (llamacpp:...), label values any escaped text.
_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\{(?:[^\"}]|\"(?:[^\"\\]|\\.)*\")*\})?"
    r"\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$"
)

# The llama-server timings fields kept per request, as `server_<field>` columns.
TIMING_FIELDS = (
    "prompt_n",
    "prompt_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_second",
)


def _number(text: str) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    return float(text)


def parse_prometheus(text: str) -> dict[str, float]:
    """Samples of a Prometheus text exposition as {name or name{labels}: value}.

    Comment and blank lines are skipped; a malformed sample line is a BadInput naming the line.
    """
    samples: dict[str, float] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise BadInput(
                f"Prometheus metrics line {number} is not `name[{{labels}}] value`: {raw!r}"
            )
        try:
            value = _number(match.group("value"))
        except ValueError:
            raise BadInput(
                f"Prometheus metrics line {number}: value {match.group('value')!r} is not a number"
            ) from None
        samples[match.group("name") + (match.group("labels") or "")] = value
    return samples


def scrape_counters(
    base_url: str, counters_http: str | None, metrics_http: str | None, timeout_s: float = 10
) -> dict[str, Any] | None:
    """Counters from a JSON endpoint and/or Prometheus text, merged; None when neither answers.

    A runtime that died mid-run answers nothing; its failure is reported from the requests, so
    an unreachable endpoint is None here, not an error.
    """
    merged: dict[str, Any] = {}
    answered = False
    if counters_http is not None:
        try:
            status, body = http_json(base_url + counters_http, timeout_s=timeout_s)
        except (OSError, urllib.error.URLError):
            status, body = 0, None
        if status == 200 and isinstance(body, dict):
            merged.update(body)
            answered = True
    if metrics_http is not None:
        try:
            status, text = http_text(base_url + metrics_http, timeout_s=timeout_s)
        except (OSError, urllib.error.URLError):
            status, text = 0, ""
        if status == 200:
            merged.update(parse_prometheus(text))
            answered = True
    return merged if answered else None


def timings_columns(timings: Mapping[str, Any] | None) -> dict[str, float | None]:
    """A llama-server ``timings`` object as ``server_<field>`` columns (None where absent)."""
    out: dict[str, float | None] = {}
    for name in TIMING_FIELDS:
        value = (timings or {}).get(name)
        out[f"server_{name}"] = float(value) if isinstance(value, int | float) else None
    return out
