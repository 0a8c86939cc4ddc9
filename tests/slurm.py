"""A real one-node Slurm cluster on 127.0.0.1 for the Slurm box tests.

``start_cluster`` writes a munge key, ``slurm.conf``, ``gres.conf`` (one fake GPU: a character
device with /dev/null's numbers, enough for ``--gres=gpu:1``) and ``cgroup.conf`` into a temporary
folder and starts ``munged``, ``slurmctld`` and ``slurmd`` as child processes on free loopback
ports, then waits until ``sinfo`` shows the node idle; ``stop_cluster`` cancels every job of the
cluster and ends the daemons by PID. Nothing outside the folder is touched, except the cgroup
folders Slurm's own proctrack/cgroup makes and removes under ``/sys/fs/cgroup/freezer``.

Measured here (Debian's Slurm 22.05 and munge 0.5.15, two cores): the cluster answers ``sinfo``
with the node idle about 1.2 s after the daemons start. The clients find the cluster through
``SLURM_CONF``, which the fixtures set in ``os.environ`` (submitit's ``sbatch`` inherits it, and
``sbatch`` hands it on to the job).

Why these settings (each verified here):

- ``proctrack/cgroup`` when the cgroup v1 freezer is writable: a runtime started with ``setsid``
  and a double fork (how every box starts one) is in the job's freezer cgroup and dies with
  ``scancel``; under ``proctrack/linuxproc`` it survives, since it is no descendant of the step.
  ``linuxproc`` is used elsewhere, and a test asks for it on purpose: the job must then stop its
  own runtime on SIGTERM.
- No accounting (no slurmdbd): ``squeue --states=all`` keeps a finished job for ``MinJobAge``,
  which the harness polls instead of ``sacct``; every wait of the harness is bounded anyway.
- ``munged`` refuses a socket folder that is not mode 0755; the clients reach it through
  ``AuthInfo=socket=…`` in ``slurm.conf``.

Test modules use the session fixture by importing it: ``from tests.slurm import slurm_cluster``.
Without root or without the binaries the fixtures skip with the reason (``make sysdeps``
installs ``slurm-wlm`` and ``munge`` as root).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scancel", "srun")
PARTITION = "debug"
FREEZER = Path("/sys/fs/cgroup/freezer")
# Seconds a finished job stays in squeue: longer than any test, so end states are read there.
MIN_JOB_AGE_S = 3600
# Seconds between scancel's SIGTERM and its SIGKILL: the job stops its runtime within them.
KILL_WAIT_S = 20


class SlurmError(RuntimeError):
    """The local cluster could not be started (test infrastructure, not the code under test)."""


@dataclass
class LocalCluster:
    """A running one-node cluster and where its files are."""

    directory: Path
    conf: Path
    munge: Path  # munged's socket, key and seed (a folder of its own in /tmp, removed at the end)
    node: str
    proctrack: str
    start_s: float  # from the first daemon's start to the node idle in sinfo
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def partition(self) -> str:
        """The one partition, holding the one node."""
        return PARTITION

    def env(self) -> dict[str, str]:
        """This process's environment with the clients pointed at this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        """A client command against this cluster."""
        return subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def log_tail(self, max_chars: int = 3000) -> str:
        """The end of each daemon's log, for failure messages."""
        parts = []
        for name in ("munged.out", "munged.log", "slurmctld.log", "slurmd.log"):
            path = self.directory / name
            with contextlib.suppress(OSError):
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-max_chars:]}")
        return "\n".join(parts)


def missing_requirements() -> str | None:
    """Why the cluster cannot start here, or None."""
    if os.geteuid() != 0:
        return "the local Slurm cluster runs its daemons as root; run the tests as root"
    absent = [name for name in (*DAEMONS, *CLIENTS) if _binary(name) is None]
    if absent:
        return (
            f"{', '.join(absent)} not installed; install them with `make sysdeps` "
            "(Debian: apt-get install slurm-wlm munge)"
        )
    return None


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidate = Path("/usr/sbin") / name
    return str(candidate) if os.access(candidate, os.X_OK) else None


def _free_ports(count: int) -> list[int]:
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def freezer_writable() -> bool:
    """True when proctrack/cgroup can work here (a writable cgroup v1 freezer)."""
    return FREEZER.is_dir() and os.access(FREEZER, os.W_OK)


def _conf_text(directory: Path, munge: Path, node: str, proctrack: str, ports: list[int]) -> str:
    host = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    return "\n".join(
        [
            f"ClusterName=harness{node}",
            # The controller must be this host's short name; it listens on loopback.
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge / 'munge.socket.2'}",
            f"SlurmctldPort={ports[0]}",
            f"SlurmdPort={ports[1]}",
            f"StateSaveLocation={directory / 'state'}",
            f"SlurmdSpoolDir={directory / 'spool'}",
            f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
            f"SlurmdPidFile={directory / 'slurmd.pid'}",
            f"SlurmctldLogFile={directory / 'slurmctld.log'}",
            f"SlurmdLogFile={directory / 'slurmd.log'}",
            f"ProctrackType={proctrack}",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            f"MinJobAge={MIN_JOB_AGE_S}",
            f"KillWait={KILL_WAIT_S}",
            "GresTypes=gpu",
            f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} "
            "RealMemory=1000 Gres=gpu:1 State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _start(cluster: LocalCluster, name: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        # A session of its own: a Ctrl-C to pytest reaches the tests, whose cleanup cancels
        # the jobs first, not the daemons under them.
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=cluster.env(),
            start_new_session=True,
        )
    cluster.processes[name] = process
    return process


def _wait_idle(cluster: LocalCluster, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in cluster.processes.values()):
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            state = cluster.run("sinfo", "-h", "-n", cluster.node, "-o", "%T", timeout_s=5)
            if state.stdout.strip() == "idle":
                return True
        time.sleep(0.1)
    return False


def start_cluster(
    directory: Path, *, node: str = "n1", proctrack: str | None = None
) -> LocalCluster:
    """Write the cluster's files into ``directory``, start its daemons, wait for the node.

    ``proctrack`` defaults to ``proctrack/cgroup`` where the freezer is writable, else
    ``proctrack/linuxproc``. Raises SlurmError, with the daemons' logs, when it does not come up.
    """
    reason = missing_requirements()
    if reason is not None:
        raise SlurmError(reason)
    if proctrack is None:
        proctrack = "proctrack/cgroup" if freezer_writable() else "proctrack/linuxproc"
    directory.mkdir(parents=True, exist_ok=True)
    for folder in (directory / "state", directory / "spool"):
        folder.mkdir(exist_ok=True)
    # munged wants its socket folder mode 0755 and every folder above it searchable by all,
    # which pytest's 0700 base folder is not: the socket lives in a folder of its own in /tmp.
    munge = Path(tempfile.mkdtemp(prefix="harness-munge-"))
    munge.chmod(0o755)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    gpu = directory / "gpu0"
    os.mknod(gpu, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a character device: /dev/null's numbers
    (directory / "gres.conf").write_text(f"NodeName={node} Name=gpu File={gpu}\n")
    (directory / "cgroup.conf").write_text(
        "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
    )
    conf = directory / "slurm.conf"
    conf.write_text(_conf_text(directory, munge, node, proctrack, _free_ports(2)))
    cluster = LocalCluster(directory, conf, munge, node, proctrack, 0.0)
    started = time.monotonic()
    try:
        _start(
            cluster,
            "munged",
            [
                str(_binary("munged")),
                "-F",
                f"--socket={munge / 'munge.socket.2'}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'munged.seed'}",
                f"--log-file={directory / 'munged.log'}",
            ],
            directory / "munged.out",
        )
        socket_path = munge / "munge.socket.2"
        deadline = time.monotonic() + 10
        while not socket_path.exists() and time.monotonic() < deadline:
            if cluster.processes["munged"].poll() is not None:
                raise SlurmError(f"munged exited:\n{cluster.log_tail()}")
            time.sleep(0.02)
        ctld = [str(_binary("slurmctld")), "-D", "-f", str(conf)]
        _start(cluster, "slurmctld", ctld, directory / "slurmctld.out")
        slurmd = [str(_binary("slurmd")), "-D", "-N", node, "-f", str(conf)]
        _start(cluster, "slurmd", slurmd, directory / "slurmd.out")
        if not _wait_idle(cluster, timeout_s=30):
            raise SlurmError(f"the local Slurm cluster did not come up:\n{cluster.log_tail()}")
    except BaseException:
        stop_cluster(cluster)
        raise
    cluster.start_s = time.monotonic() - started
    return cluster


def _jobs(cluster: LocalCluster) -> list[str]:
    """Jobs of the cluster not finished yet, as ``id state``."""
    listing = cluster.run("squeue", "-h", "-o", "%i %T", timeout_s=10)
    return [line for line in listing.stdout.splitlines() if line.strip()]


def cancel_all(cluster: LocalCluster, timeout_s: float = KILL_WAIT_S + 15) -> list[str]:
    """Cancel every job of the cluster and wait until none is left; the jobs still listed at
    the deadline (empty when all ended)."""
    if (
        cluster.processes.get("slurmctld") is None
        or cluster.processes["slurmctld"].poll() is not None
    ):
        return []
    with contextlib.suppress(subprocess.TimeoutExpired):
        cluster.run("scancel", "--user", "root", timeout_s=10)
    deadline = time.monotonic() + timeout_s
    left: list[str] = []
    while time.monotonic() < deadline:
        try:
            left = _jobs(cluster)
        except subprocess.TimeoutExpired:
            left = ["squeue timed out"]
        if not left:
            return []
        time.sleep(0.2)
    return left


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def stop_cluster(cluster: LocalCluster) -> list[str]:
    """Cancel every job, then stop slurmd, slurmctld and munged by PID (TERM, then KILL after
    10 s). Returns the jobs that were still listed when the daemons stopped."""
    left = cancel_all(cluster)
    for name in ("slurmd", "slurmctld", "munged"):
        process = cluster.processes.get(name)
        if process is not None:
            _stop(process)
    shutil.rmtree(cluster.munge, ignore_errors=True)
    return left


@contextlib.contextmanager
def cluster_env(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """``SLURM_CONF`` pointing at ``cluster`` in this process's environment, restored after."""
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@contextlib.contextmanager
def local_cluster(directory: Path, **options: str) -> Iterator[LocalCluster]:
    """A cluster for one block (skipped without root or binaries), stopped at its end."""
    reason = missing_requirements()
    if reason is not None:
        pytest.skip(reason)
    try:
        cluster = start_cluster(directory, **options)
    except (SlurmError, OSError, subprocess.SubprocessError) as exc:
        pytest.fail(f"local Slurm cluster unavailable: {exc}", pytrace=False)
    try:
        with cluster_env(cluster):
            yield cluster
    finally:
        left = stop_cluster(cluster)
        assert not left, f"jobs still listed when the cluster stopped: {left}"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's one-node cluster, ``SLURM_CONF`` set for it; skips without root/binaries."""
    with local_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
