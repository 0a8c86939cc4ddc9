"""SGLang's expert-distribution recorder around a run's scored workload.

A profile's ``telemetry.expert_recorder`` says the runtime records expert routing itself (SGLang
with ``--expert-distribution-recorder-mode``, KTransformers inside it). Before the scored
workload the runner POSTs ``/start_expert_distribution_record`` (which also clears what an
earlier run left); after it, ``/stop_expert_distribution_record`` and
``/dump_expert_distribution_record``, and takes the files that dump added to the recorder folder
(``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR``). They are kept under the run's
``expert-distribution/`` and read without torch (:mod:`harness.formats.expert_distribution`):

* the counts summed over passes become the run's ``route-counts.json`` (the route-count dump
  format vLLM's and seed 000's runs keep, so ``harness fit-map`` fits from it alike) and its
  ``route_selections`` counter;
* with KTransformers' ``gpu_expert_masks`` (its SGLang build writes them to
  ``gpu_expert_distribution_<time>.pt`` beside the counts): ``hits`` = Σ counts × masks
  (selections of experts on the GPU in their pass) and ``misses`` the rest, so the run has a
  ``hit_rate``. A pass KT ran wholly on the GPU (a prefill of at least
  ``kt_gpu_prefill_token_threshold`` tokens, the spec's ``full_gpu_prefill_knob``) is in
  neither: its selections are ``full_gpu_selections``, so the hit rate is the hybrid passes'.
  Telling such a pass needs the router's top-k, read from the model's ``config.json`` on the
  box; without it the run has no hits or misses (no hit rate), never a wrong one.
* with SGLang's Paged Experts on (the spec's ``paged_experts`` knobs), which counts nothing: the
  passes replayed through its own LRU with the cell's resident count give ``replayed_hits`` and
  ``replayed_misses`` (:mod:`harness.policy.paged_experts`), a hit rate replayed, not measured.

The recorder counts from its start, so these are the run's own counts; the counters before the
workload read 0.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
import time
import urllib.error
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.boxes.base import Box
from harness.errors import HarnessError, InfrastructureError
from harness.formats.expert_distribution import (
    ExpertDistribution,
    combine_dumps,
    full_gpu_passes,
    gpu_hits,
    kt_text_config,
    read_dump,
)
from harness.formats.maps import write_count_dump
from harness.policy.paged_experts import replay_paged_experts
from harness.profiles.schema import switch_state
from harness.profiles.telemetry import ExpertRecorderSpec
from harness.runtimes.boot import RunningRuntime, http_request, render
from harness.runtimes.routes import ROUTE_COUNTER

__all__ = [
    "FULL_GPU_COUNTER",
    "REPLAYED_HITS",
    "REPLAYED_MISSES",
    "Recording",
    "finish_recording",
    "full_gpu_threshold",
    "model_config_on_box",
    "recorder_folder",
    "replayed_counters",
    "router_top_k",
    "run_counters",
    "start_recording",
]

# Selections of passes run wholly on the GPU, in neither hits nor misses (harness/catalog.py).
FULL_GPU_COUNTER = "full_gpu_selections"
# Paged Experts' residency replayed over the recorded passes (harness/catalog.py).
REPLAYED_HITS = "replayed_hits"
REPLAYED_MISSES = "replayed_misses"


@dataclass
class Recording:
    """A record in progress on one runtime: where its dump files will appear."""

    spec: ExpertRecorderSpec
    folder: str


def recorder_folder(spec: ExpertRecorderSpec, run_dir: str) -> str:
    """The recorder folder on the box for a boot whose folder is ``run_dir``."""
    return render(spec.dir, {"run_dir": run_dir})


def _post(runtime: RunningRuntime, path: str, timeout_s: float) -> None:
    url = runtime.base_url + path
    try:
        # The boot's token, where the profile gives one: a start, stop or dump from anyone
        # else would change what the run records.
        status, body = http_request(
            url, "POST", b"", timeout_s=timeout_s, headers=runtime.admin_headers
        )
    except (OSError, urllib.error.URLError) as exc:
        raise InfrastructureError(f"POST {path}: the runtime did not answer: {exc}") from None
    if status != 200:
        raise InfrastructureError(
            f"POST {path}: HTTP {status}: {body.strip()[:300]} (is the runtime started with "
            "--expert-distribution-recorder-mode?)"
        )


def start_recording(runtime: RunningRuntime, spec: ExpertRecorderSpec, run_dir: str) -> Recording:
    """Start a record (clearing any earlier one) before the scored workload."""
    folder = recorder_folder(spec, run_dir)
    runtime.box.mkdirs(folder)
    _post(runtime, spec.start_http, 30)
    return Recording(spec, folder)


def per_token_counts(
    dist: ExpertDistribution, spec: ExpertRecorderSpec, knobs: Mapping[str, str]
) -> ExpertDistribution:
    """The dump's counts as one count per routed token: divided by the ranks that each
    recorded every token (``spec.replicas_knob``; SGLang 0.5.23's stat dump all-reduces its
    count over the world group, ``eplb/expert_distribution.py``, and under tensor parallelism
    without an all-to-all backend every rank routes the whole batch). Counts that are not
    whole multiples of it mean the ranks recorded different tokens: refused, not guessed."""
    if spec.replicas_knob is None:
        return dist
    sharded = spec.sharding_knob is not None and knobs.get(spec.sharding_knob, "none") != "none"
    replicas = int(knobs.get(spec.replicas_knob, "1") or "1")
    if sharded or replicas <= 1:
        return dist
    if np.any(dist.counts % replicas):
        raise InfrastructureError(
            f"expert-distribution dump: counts are not whole multiples of {spec.replicas_knob} "
            f"{replicas}, so its ranks did not each record every token (data-parallel "
            f"attention, or an all-to-all backend {spec.sharding_knob or 'knob'} does not "
            "name?): set the knobs the ranks ran with, or record with one rank"
        )
    return dataclasses.replace(dist, counts=dist.counts // replicas)


def finish_recording(
    runtime: RunningRuntime,
    recording: Recording,
    local_dir: Path,
    counts_name: str = "route-counts.json",
) -> dict[str, float]:
    """Stop, dump, fetch the dump's new files into ``local_dir/expert-distribution``, write
    their counts summed over passes as ``counts_name`` (a route-count dump) and return the
    run's counters (``route_selections``, and ``hits`` / ``misses`` when the dump holds GPU
    masks)."""
    spec, box = recording.spec, runtime.box
    patterns = [posixpath.join(recording.folder, glob) for glob in spec.glob]
    _post(runtime, spec.stop_http, 30)
    before = set(box.glob(patterns))
    _post(runtime, spec.dump_http, spec.timeout_s)
    # SGLang answers once its scheduler has written the files; a remote box's file system may
    # show them a moment later, so wait (bounded) for new names whose sizes have settled.
    deadline = time.monotonic() + spec.timeout_s
    new: list[str] = []
    sizes: dict[str, str] = {}
    while True:
        new = sorted(set(box.glob(patterns)) - before)
        if new:
            now = {name: box.sh(f"wc -c < {shlex.quote(name)}", check=False).stdout for name in new}
            if now == sizes:
                break
            sizes = now
        if time.monotonic() > deadline:
            what = "still growing" if new else "not written"
            raise InfrastructureError(
                f"POST {spec.dump_http}: {', '.join(spec.glob)} in {recording.folder} {what} after "
                f"{spec.timeout_s:g} s (is SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR that folder?)"
            )
        time.sleep(0.2)
    folder = local_dir / "expert-distribution"
    folder.mkdir(parents=True, exist_ok=True)
    dumps = []
    for remote in new:
        local = folder / posixpath.basename(remote)
        box.get_file(remote, local)
        dumps.append(read_dump(local))
    knobs = runtime.spec.knobs
    dist = per_token_counts(combine_dumps(dumps, str(folder)), spec, knobs)
    counts = dist.counts.sum(axis=0)
    write_count_dump(local_dir / counts_name, np.asarray(counts), time.time())
    needs_top_k = dist.masks is not None and full_gpu_threshold(spec, knobs) > 0
    top_k = router_top_k(runtime.box, knobs.get("model", "")) if needs_top_k else None
    return run_counters(dist, spec, knobs, top_k)


def run_counters(
    dist: ExpertDistribution,
    spec: ExpertRecorderSpec,
    knobs: Mapping[str, str],
    top_k: int | None,
) -> dict[str, float]:
    """A dump's counters: ``route_selections``; with GPU masks, ``hits`` and ``misses``, less
    the passes the runtime ran wholly on the GPU (``full_gpu_selections``), told by the
    router's ``top_k``. Where there are such passes to leave out and ``top_k`` is None, no hits
    or misses: the hit rate is missing, never one counting GPU work as misses."""
    counters: dict[str, float] = {ROUTE_COUNTER: float(dist.counts.sum())}
    counters.update(replayed_counters(dist, spec, knobs))
    if dist.masks is None:
        return counters
    left_out = None
    threshold = full_gpu_threshold(spec, knobs)
    if threshold > 0:
        if top_k is None:
            return counters
        left_out = full_gpu_passes(dist, threshold, top_k)
        counters[FULL_GPU_COUNTER] = float(dist.counts[left_out].sum())
    split = gpu_hits(dist, left_out)
    if split is not None:
        counters["hits"], counters["misses"] = float(split[0]), float(split[1])
    return counters


def replayed_counters(
    dist: ExpertDistribution, spec: ExpertRecorderSpec, knobs: Mapping[str, str]
) -> dict[str, float]:
    """``replayed_hits`` and ``replayed_misses`` of a run with SGLang's Paged Experts on: its
    recorded passes replayed through Paged Experts' own LRU (:mod:`harness.policy.paged_experts`)
    with the cell's resident count, since the runtime counts none. Replayed, not measured: named
    so in every counter, metric and table. Empty for any other run."""
    paged = spec.paged_experts
    if paged is None or switch_state(str(knobs.get(paged.switch_knob, ""))) is not True:
        return {}
    slots = str(knobs.get(paged.slots_knob, ""))
    if not slots.isdigit() or int(slots) < 1:
        return {}  # SGLang refuses to boot without it (and `validate` says so)
    replayed = replay_paged_experts(dist.counts, int(slots))
    return {REPLAYED_HITS: float(replayed.hits), REPLAYED_MISSES: float(replayed.misses)}


def full_gpu_threshold(spec: ExpertRecorderSpec, knobs: Mapping[str, str]) -> int:
    """The tokens from which the runtime runs a pass wholly on the GPU (0: never)."""
    if spec.full_gpu_prefill_knob is None:
        return 0
    value = str(knobs.get(spec.full_gpu_prefill_knob, "") or "0")
    return int(value) if value.isdigit() else 0


def model_config_on_box(box: Box, model: str) -> tuple[str, dict[str, Any] | None]:
    """A model folder's ``config.json`` path on the box, and its contents (None where it
    cannot be read or is not an object: a Hugging Face name, say)."""
    path = f"{model.rstrip('/')}/config.json"
    try:
        config = json.loads(box.read_text(path) or "null")
    except (HarnessError, OSError, ValueError):
        return path, None
    return path, config if isinstance(config, dict) else None


def router_top_k(box: Box, model: str) -> int | None:
    """The model's router top-k (``num_experts_per_tok``, of the text config of a VL model)
    from ``MODEL/config.json`` on the box; None where ``model`` is not a folder there with
    one (a Hugging Face name, say)."""
    if not model:
        return None
    _, config = model_config_on_box(box, model)
    if config is None:
        return None
    top_k = kt_text_config(config).get("num_experts_per_tok")
    return top_k if isinstance(top_k, int) and top_k > 0 else None
