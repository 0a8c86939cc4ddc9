"""What a ``kind: slurm`` box may set, checked beside its other fields (``BoxSpec``).

The check reads a box through :class:`BoxFields` (the fields it needs), so this module imports
nothing of ours and the schema imports it, never the other way round.
"""

from __future__ import annotations

import re
from collections.abc import Set
from typing import Protocol

# [D-]HH:MM[:SS], D-HH, MM or MM:SS: the time limits sbatch takes (D-HH:MM:SS covers them all).
_SLURM_TIME = re.compile(
    r"(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?)"
    r"|(?:(?P<h>\d+):(?P<m>\d+):(?P<s>\d+))"
    r"|(?:(?P<mm>\d+)(?::(?P<ss>\d+))?)"
)


def slurm_minutes(value: str | int) -> int:
    """A Slurm time limit (minutes, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in whole
    minutes, rounded up; ValueError naming the forms when it is none of them."""
    match = _SLURM_TIME.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(
            f"`time` {value!r} is not a Slurm time limit: give minutes (90), HH:MM:SS "
            "(01:30:00) or D-HH:MM:SS (1-00:00:00)"
        )
    part = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "days" in part:
        seconds = ((part["days"] * 24 + part["dh"]) * 60 + part.get("dm", 0)) * 60
        seconds += part.get("ds", 0)
    elif "h" in part:
        seconds = (part["h"] * 60 + part["m"]) * 60 + part["s"]
    else:
        seconds = part["mm"] * 60 + part.get("ss", 0)
    if seconds <= 0:
        raise ValueError(f"`time` {value!r} is no time at all: give a positive time limit")
    return -(-seconds // 60)


# Fields only a slurm box takes, and those only an ssh box takes.
SLURM_FIELDS = (
    "partition",
    "gres",
    "gpus",
    "account",
    "time",
    "constraint",
    "setup",
    "shared_dir",
    "max_parallel",
)
SSH_FIELDS = ("host", "port", "user", "key", "gateway")


class BoxFields(Protocol):
    """What the check reads of a box (``BoxSpec`` has these)."""

    @property
    def model_fields_set(self) -> Set[str]: ...
    @property
    def kind(self) -> str: ...
    @property
    def shared_dir(self) -> str | None: ...
    @property
    def gres(self) -> str | None: ...
    @property
    def gpus(self) -> int | None: ...
    @property
    def time(self) -> str | int | None: ...


def _names(fields: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in fields)


def slurm_fields_problem(spec: BoxFields) -> str | None:
    """Why the box's slurm settings do not fit its kind (naming the fields and the fix), or
    None when they do."""
    given = spec.model_fields_set
    if spec.kind != "slurm":
        stray = [name for name in SLURM_FIELDS if name in given]
        if not stray:
            return None
        one = len(stray) == 1
        return (
            f"{_names(stray)}: only a slurm box takes {'this' if one else 'these'}; set "
            f"kind: slurm, or drop {'it' if one else 'them'}"
        )
    stray = [name for name in SSH_FIELDS if name in given]
    if stray:
        return (
            f"{_names(stray)}: a slurm box submits with this machine's sbatch and takes no ssh "
            "settings; run the harness on a host that submits to the cluster (a login node), "
            "and drop them"
        )
    if not spec.shared_dir:
        return (
            "a slurm box needs `shared_dir`: a folder this machine and every node see (NFS, "
            "Lustre), for the cohorts' job folders and logs"
        )
    if not spec.shared_dir.startswith(("/", "~/")):
        return (
            f"`shared_dir` {spec.shared_dir!r} must be absolute or start with ~/: the nodes "
            "resolve it, not the card's folder"
        )
    if spec.gres is not None and spec.gpus is not None:
        return "give a slurm box `gres` or `gpus`, not both (gpus: 1 is gres: gpu:1)"
    if spec.time is not None:
        try:
            slurm_minutes(spec.time)
        except ValueError as exc:
            return str(exc)
    return None


__all__ = ["SLURM_FIELDS", "SSH_FIELDS", "BoxFields", "slurm_fields_problem", "slurm_minutes"]
