"""A box as data: where commands run (this machine, a host over SSH, a Slurm cluster)."""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.profiles.base import Platform, Strict
from harness.profiles.slurm_fields import slurm_fields_problem, slurm_minutes


class BoxSpec(Strict):
    """Where commands run: this machine, a host over SSH (fabric), or nodes of a Slurm cluster
    (each cohort one job, submitted from this machine with submitit: harness/execute/slurm/)."""

    kind: Literal["local", "ssh", "slurm"] = Field(
        "local", description="local subprocesses, ssh, or jobs on a slurm cluster"
    )
    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="what an inline box of a card's `boxes` list is called (a boxes file's "
        "entries are named by their key)",
    )
    host: str | None = Field(None, description="ssh host name or alias from ~/.ssh/config")
    port: int | None = Field(None, ge=1, le=65535, description="ssh port (default: ssh config/22)")
    user: str | None = Field(None, description="ssh user (default: ssh config/current user)")
    key: str | None = Field(None, description="private key file, ~ expanded")
    gateway: str | None = Field(None, description="ProxyJump host, as user@host:port")
    python: str | None = Field(
        None,
        description="Python interpreter on the box (for the refbox); default: this harness's "
        "own interpreter on a local box, python3 over ssh",
    )
    platform: Platform = Field("linux-cpu", description="what the box is, for cache drops etc.")
    workdir: str = Field(
        "~/.cache/harness/runs", description="directory on the box for run files and uploads"
    )
    insecure_accept_unknown_host_key: bool = Field(
        False, description="accept host keys missing from known_hosts (off: check known_hosts)"
    )
    known_hosts: str | None = Field(
        None,
        description="extra known_hosts file (~ expanded), checked besides ~/.ssh/known_hosts "
        "and the ssh config's UserKnownHostsFile",
    )
    env: dict[str, str] = Field(default_factory=dict, description="env for every command")
    partition: str | None = Field(
        None, description="slurm: the partition its jobs run in (default: the cluster's)"
    )
    gres: str | None = Field(
        None, description="slurm: generic resources per job (--gres), e.g. gpu:1 or gpu:h200:8"
    )
    gpus: int | None = Field(
        None, ge=1, le=1024, description="slurm: GPUs per node (--gpus-per-node), or use `gres`"
    )
    account: str | None = Field(None, description="slurm: the account jobs are charged to")
    time: str | int | None = Field(
        None,
        description="slurm: time limit of one cohort's job: minutes, HH:MM:SS or D-HH:MM:SS "
        "(default: the partition's)",
    )
    constraint: str | None = Field(None, description="slurm: node features (--constraint)")
    setup: list[str] = Field(
        default_factory=list,
        description="slurm: shell lines the job runs before the harness starts on the node "
        "(module load …, source a venv)",
    )
    shared_dir: str | None = Field(
        None,
        description="slurm: a folder this machine and every node see (NFS, Lustre), absolute or "
        "~/: the cohorts' job folders, their logs and the runtimes' files",
    )
    max_parallel: int | None = Field(
        None, ge=1, le=100000, description="slurm: cohort jobs running at once (default: all)"
    )
    drive: Literal["tunnel", "on-box"] | None = Field(
        None,
        description="ssh only: where the workload driver runs: `tunnel` (default: here, its "
        "requests carried to the box's 127.0.0.1 by an SSH tunnel) or `on-box` (on the box "
        "itself, with the box's python and aiohttp; the results are fetched back)",
    )

    @property
    def drives_on_box(self) -> bool:
        """True when the workload driver runs on the box (``drive: on-box``)."""
        return self.drive == "on-box"

    def python_path(self) -> str:
        """The interpreter to run on the box."""
        if self.python:
            return self.python
        # A slurm node shares this machine's file system, venv included, as a rule.
        return "python3" if self.kind == "ssh" else sys.executable

    def time_limit_min(self) -> int | None:
        """A slurm box's time limit per job in whole minutes (None: the partition's)."""
        return None if self.time is None else slurm_minutes(self.time)

    @model_validator(mode="after")
    def _kind_fields(self) -> BoxSpec:
        if self.kind == "ssh" and not self.host:
            raise ValueError("an ssh box needs `host`")
        if self.kind == "local" and self.host:
            raise ValueError("a local box takes no `host`; set kind: ssh")
        problem = slurm_fields_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @field_validator("drive")
    @classmethod
    def _drive_is_for_ssh(cls, drive: str | None, info: ValidationInfo) -> str | None:
        if drive is not None and info.data.get("kind") in ("local", "slurm"):
            raise ValueError(
                f"a {info.data.get('kind')} box takes no `drive`: its driver already runs beside "
                "its runtime, with no tunnel; remove `drive` (it is for ssh boxes)"
            )
        return drive
