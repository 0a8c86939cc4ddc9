"""What lets a killed campaign continue: checkpoints of a long run and the runtimes it left.

A run with a timed phase is cut into segments of at most ``CHECKPOINT_S``; each finished segment
is journalled with its records, and :func:`read_checkpoints` reads that journal back so
``harness run --resume`` starts at the first segment not journalled. A runtime the killed
harness left running is stopped first, but only if its PID still names the same process
(:func:`harness.runtimes.orphans.kill_orphan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.drive.client import PhasePlan
from harness.formats.records import RUN_INTERRUPTED, CampaignDir, Journal, read_parquet

# Seconds of a timed phase between checkpoints: a soak killed at hour 30 loses at most this much.
CHECKPOINT_S = 600.0


def split_phases(phases: list[PhasePlan], checkpoint_s: float) -> list[PhasePlan]:
    """Cut every timed phase into pieces of at most ``checkpoint_s``; other phases stay whole.

    Each piece is one checkpoint segment: driven, then journalled with its requests and the ring
    drained up to its end, so a resumed run starts at the first piece not journalled.
    """
    pieces: list[PhasePlan] = []
    for phase in phases:
        if phase.duration_s is None or phase.duration_s <= checkpoint_s:
            pieces.append(phase)
            continue
        remaining_s = phase.duration_s
        while remaining_s > 1e-9:
            piece_s = min(checkpoint_s, remaining_s)
            pieces.append(PhasePlan(phase.name, phase.index, phase.items, piece_s))
            remaining_s -= piece_s
    return pieces


@dataclass
class BootRecord:
    """What the checkpoint journal says about one boot of a checkpointed run."""

    boot: int
    pgid: int = 0
    remote_dir: str = ""
    counters_before: dict[str, Any] | None = None
    swap_before: int | None = None
    counters_last: dict[str, Any] | None = None
    swap_last: int | None = None
    ring_seq: int = 0  # drained through this sequence at the last checkpoint
    ring_lost: int = 0  # lost records counted by the drains up to that checkpoint
    ring_dropped: int = 0
    segments: list[int] = field(default_factory=list)
    t_first_s: float | None = None  # wall-clock span of the boot's checkpointed segments
    t_last_s: float | None = None


@dataclass
class CheckpointState:
    """The checkpoint journal of one run read back: its boots and finished segments."""

    checkpoint_s: float
    origin_wall: float  # time.time() that request and sample times count from
    started_at: float  # when the run's first boot started
    boots: list[BootRecord]

    @property
    def done_segments(self) -> set[int]:
        """Segments journalled as complete, over every boot."""
        return {j for boot in self.boots for j in boot.segments}


def read_checkpoints(journal: Journal) -> CheckpointState | None:
    """The boots and segments a checkpoint journal records, or None when it records no boot."""
    checkpoint_s, origin_wall, started_at = CHECKPOINT_S, 0.0, 0.0
    boots: dict[int, BootRecord] = {}
    for event in journal.events():
        kind = event.get("event")
        if kind == "plan":
            checkpoint_s = float(event["checkpoint_s"])
            origin_wall = float(event["origin_wall"])
            started_at = float(event.get("started_at", origin_wall))
        elif kind == "boot":
            boots[int(event["boot"])] = BootRecord(
                boot=int(event["boot"]),
                pgid=int(event["pgid"]),
                remote_dir=str(event.get("remote_dir", "")),
            )
        elif kind == "scored_start" and int(event["boot"]) in boots:
            boot = boots[int(event["boot"])]
            boot.counters_before = event.get("counters")
            boot.swap_before = event.get("swapout_pages")
        elif kind == "segment_done" and int(event["boot"]) in boots:
            boot = boots[int(event["boot"])]
            boot.segments.append(int(event["segment"]))
            boot.counters_last = event.get("counters")
            boot.swap_last = event.get("swapout_pages")
            boot.ring_seq = int(event["ring_seq"])
            boot.ring_lost = int(event["ring_lost"])
            boot.ring_dropped = int(event["ring_dropped"])
            t_s = float(event["t"]) - origin_wall
            boot.t_first_s = t_s if boot.t_first_s is None else boot.t_first_s
            boot.t_last_s = t_s
    if not boots:
        return None
    return CheckpointState(checkpoint_s, origin_wall, started_at, [boots[k] for k in sorted(boots)])


def segment_paths(folder: Path, segment: int) -> tuple[Path, Path]:
    """The requests and chunks files of one journalled segment in a run's checkpoint folder."""
    return (
        folder / f"seg-{segment:05d}.requests.parquet",
        folder / f"seg-{segment:05d}.chunks.parquet",
    )


def samples_path(folder: Path, boot: int) -> Path:
    """The memory samples of one boot, rewritten at each of its checkpoints."""
    return folder / f"samples-b{boot}.parquet"


def earlier_frames(
    folder: Path, previous: CheckpointState
) -> tuple[list[tuple[pd.DataFrame, pd.DataFrame]], list[pd.DataFrame]]:
    """Requests/chunks of every journalled segment of earlier boots, and their samples."""
    frames = []
    samples = []
    for earlier in previous.boots:
        for index in earlier.segments:
            requests, chunks = segment_paths(folder, index)
            frames.append((read_parquet(requests), read_parquet(chunks)))
        path = samples_path(folder, earlier.boot)
        if path.is_file():
            samples.append(read_parquet(path))
    return frames, samples


def continues_from(
    campaign: CampaignDir, run_id: str, local_dir: Path, attempt: int, checkpointed: bool
) -> CheckpointState | None:
    """The checkpoints a run continues from, or None when it must be redone whole.

    Only a checkpointed run that never finished (killed harness) or was interrupted continues;
    one that failed, or a retry after a failure, starts again. (A runtime the killed harness
    left running was stopped when the campaign resumed.)
    """
    journal_path = local_dir / "checkpoint" / "segments.jsonl"
    if attempt != 1 or not checkpointed or not journal_path.is_file():
        return None
    state = read_checkpoints(Journal(journal_path))
    if state is None or not state.done_segments:
        return None
    record = campaign.run_record(run_id)
    if record is not None and record.get("status") != RUN_INTERRUPTED:
        return None
    return state


__all__ = [
    "CHECKPOINT_S",
    "BootRecord",
    "CheckpointState",
    "continues_from",
    "earlier_frames",
    "read_checkpoints",
    "samples_path",
    "segment_paths",
    "split_phases",
]
