"""Booting, probing and stopping a runtime on a box, as its profile says.

A profile's templates may use ``{port}``, ``{run_dir}``, ``{python}``, ``{bind_host}`` and
``{files.NAME}`` (the path of an uploaded knob file). Cell knobs reach the runtime as env, flags or
live knobs exactly as the profile declares; every value is passed literally (quoting is the box's
job, done once in :func:`harness.boxes.base.shell_command`).
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.boxes.base import Box, quote_path, shell_command
from harness.boxes.interrupts import deferred
from harness.boxes.tunnel import refusal
from harness.card import Cell, KnobValue
from harness.errors import KnobError, RuntimeBootError
from harness.profiles.live import LiveAction
from harness.profiles.schema import RuntimeProfile, switch_state


class _Context(dict[str, Any]):
    """Template values; ``{files.NAME}`` resolves through the nested ``files`` mapping."""


def knob_text(value: KnobValue) -> str:
    """A knob value as the text a runtime reads (booleans as 1/0)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def render(template: str, context: Mapping[str, Any]) -> str:
    """Fill ``{name}`` and ``{files.NAME}`` placeholders; unknown names are a profile error."""

    def replace(match: re.Match[str]) -> str:
        key = match.group(1)
        if key.startswith("files."):
            files = context.get("files", {})
            name = key.split(".", 1)[1]
            if name not in files:
                raise KnobError(f"profile placeholder {{{key}}}: the cell uploads no file {name!r}")
            return str(files[name])
        if key not in context:
            raise KnobError(f"profile placeholder {{{key}}} is unknown; known: {sorted(context)}")
        return str(context[key])

    return re.sub(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}", replace, template)


@dataclass
class BootSpec:
    """The concrete command, environment and live knobs of one boot."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    live: dict[str, KnobValue]  # sent as JSON, so typed as the card wrote them (1, not "1")
    port: int
    run_dir: str
    log_path: str
    knobs: dict[str, str] = field(default_factory=dict)


def boot_spec(
    profile: RuntimeProfile,
    cell: Cell,
    *,
    port: int,
    run_dir: str,
    python: str,
    bind_host: str,
    cache_dir: str,
    uploaded: Mapping[str, str],
) -> BootSpec:
    """Turn a profile and a cell into the argv/env of one boot."""
    context = _Context(
        port=port,
        run_dir=run_dir,
        python=python,
        bind_host=bind_host,
        cache_dir=cache_dir,
        files=dict(uploaded),
    )
    argv = [render(item, context) for item in profile.boot.command]
    env = {key: render(value, context) for key, value in profile.boot.env.items()}
    live: dict[str, KnobValue] = {}
    effective: dict[str, str] = {}
    settings: dict[str, KnobValue] = {
        name: spec.default for name, spec in profile.knobs.items() if spec.default is not None
    }
    settings.update(cell.knobs)
    for name, value in settings.items():
        spec = profile.knobs[name]
        text = knob_text(value)
        effective[name] = text
        if spec.switch and spec.arg:
            flag = spec.arg if switch_state(text) else spec.off_arg
            if flag:
                argv.append(flag)
        elif spec.switch and spec.env:
            if switch_state(text):  # presence-tested: off is unset, never "0"
                env[spec.env] = "1"
        elif spec.env:
            env[spec.env] = text
        elif spec.arg:
            argv.extend([spec.arg, text])
        elif spec.live:
            live[spec.live] = value
    for key, value in cell.env.items():
        env[key] = knob_text(value)
        effective[f"env.{key}"] = knob_text(value)
    for name, remote in uploaded.items():
        route, _, target = profile.files[name].partition(":")
        if route == "arg":
            argv.extend([target, remote])
        else:
            env[target] = remote
        effective[f"files.{name}"] = remote
    argv.extend(render(item, context) for item in cell.args)
    for key, value in cell.live.items():
        live[key] = value
        effective[f"live.{key}"] = knob_text(value)
    cwd = render(profile.boot.cwd, context) if profile.boot.cwd else None
    return BootSpec(
        argv=argv,
        env=env,
        cwd=cwd,
        live=live,
        port=port,
        run_dir=run_dir,
        log_path=f"{run_dir}/server.log",
        knobs=effective,
    )


def live_settings(
    profile: RuntimeProfile, cell: Cell, uploaded: Mapping[str, str]
) -> dict[str, KnobValue]:
    """Everything of a cell a running runtime can take: its knobs (and defaults) that have a
    ``live`` key, its ``live:`` values and the uploaded paths of its live file knobs. A cell
    sharing a boot with another sends these after the reset, so it runs on its own settings
    whatever the boot was started with."""
    settings: dict[str, KnobValue] = {
        name: spec.default for name, spec in profile.knobs.items() if spec.default is not None
    }
    settings.update(cell.knobs)
    live: dict[str, KnobValue] = {}
    for name, value in settings.items():
        key = profile.knobs[name].live
        if key:
            live[key] = value
    live.update(cell.live)
    live_files = profile.live.files if profile.live is not None else {}
    for name, remote in uploaded.items():
        if name in live_files:
            live[live_files[name]] = remote
    return live


def same_setting(got: Any, wanted: Any) -> bool:
    """Whether a setting read back from a runtime is the one sent: numbers by value (a card's
    "64" and a runtime's 64 agree), everything else by its JSON text."""
    try:
        return float(got) == float(wanted)
    except (TypeError, ValueError):
        return json.dumps(got) == json.dumps(wanted)


def http_json(
    url: str,
    payload: Mapping[str, Any] | None = None,
    timeout_s: float = 10,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, Any]:
    """GET (or POST ``payload``) and decode JSON; returns (status, body or None). ``headers``
    ride along (the boot's admin token)."""
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(
        url,
        data=data,
        headers={"Content-Type": "application/json", **(headers or {})},
        method="POST" if data else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        body = exc.read()
        status = exc.code
        _raise_refused(status, exc.headers, body)
    try:
        return status, json.loads(body) if body else None
    except json.JSONDecodeError:
        return status, body.decode("utf-8", "replace")


def http_request(
    url: str,
    method: str,
    body: bytes | None,
    timeout_s: float = 30,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Send ``body`` (JSON; None for a GET) with ``method``; returns (status, body text), errors
    included. ``headers`` ride along (the boot's admin token)."""
    request = urllib.request.Request(
        url,
        data=body,
        headers={"Content-Type": "application/json", **(headers or {})},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        _raise_refused(exc.code, exc.headers, text)
        return exc.code, text.decode("utf-8", "replace")


def http_text(url: str, timeout_s: float = 10) -> tuple[int, str]:
    """GET a URL as text."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        _raise_refused(exc.code, exc.headers, text)
        return exc.code, text.decode("utf-8", "replace")


def _raise_refused(status: int, headers: Any, body: bytes) -> None:
    """A tunnel's stand-in for a refused connection raises what a direct connection would."""
    if refusal(status, headers or {}) is not None:
        raise ConnectionRefusedError(body.decode("utf-8", "replace"))


@dataclass
class RunningRuntime:
    """A booted runtime: its box, process group, port and boot spec."""

    box: Box
    profile: RuntimeProfile
    spec: BootSpec
    pgid: int
    base_url: str
    boot_s: float = 0.0
    live_seq: int = 0  # live changes sent to this boot; a control file's {seq}

    @property
    def admin_headers(self) -> dict[str, str]:
        """The boot's admin token as the header every live knob request carries (none when
        the profile declares no ``admin_token_env``)."""
        name = self.profile.admin_token_env
        token = self.spec.env.get(name) if name else None
        return {"Authorization": f"Bearer {token}"} if token else {}

    def read_back(self, expected: Mapping[str, Any]) -> str | None:
        """What the runtime says it runs with (``live.state``) against ``expected``, the live
        settings the harness gave it: None when they agree (or the profile has no state
        path), else what differs, naming each setting."""
        live = self.profile.live
        if live is None or live.state is None or not expected:
            return None
        status, state = http_json(self.base_url + live.state, headers=self.admin_headers)
        if not (200 <= status < 300 and isinstance(state, dict)):
            return f"live.state {live.state}: HTTP {status}, not a JSON object: {state!s:.200}"
        differ = [
            f"{key} {state.get(key)!r:.60} (the cell's {value!r:.60})"
            for key, value in expected.items()
            if not same_setting(state.get(key), value)
        ]
        if not differ:
            return None
        return (
            "the runtime did not run with the cell's settings (changed mid-run by something "
            f"other than this harness?): {'; '.join(differ)}"
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log."""
        text = self.box.read_text(self.spec.log_path, tail_bytes=16384)
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self) -> None:
        """Block until the readiness probe passes; RuntimeBootError with the log tail if not."""
        ready = self.profile.ready
        if ready is None:  # a command driver: nothing to wait for
            return
        started = time.monotonic()
        pattern = re.compile(ready.log_line) if ready.log_line else None
        while True:
            elapsed = time.monotonic() - started
            if not self.box.group_alive(self.pgid):
                raise RuntimeBootError(
                    f"runtime {self.profile.name} exited during boot; log tail:\n{self.log_tail()}"
                )
            http_ok = True
            if ready.http is not None:
                try:
                    status, _ = http_text(self.base_url + ready.http.path, timeout_s=2)
                    http_ok = status == ready.http.status
                except (urllib.error.URLError, OSError, TimeoutError):
                    http_ok = False
            log_ok = True
            if pattern is not None:
                log_ok = bool(pattern.search(self.box.read_text(self.spec.log_path)))
            if http_ok and log_ok:
                self.boot_s = elapsed
                return
            if elapsed > ready.timeout_s:
                raise RuntimeBootError(
                    f"runtime {self.profile.name} not ready after {ready.timeout_s:g} s "
                    f"(probe {'http ' + ready.http.path if ready.http else ''}"
                    f"{' log ' + ready.log_line if ready.log_line else ''}); "
                    f"log tail:\n{self.log_tail()}"
                )
            time.sleep(ready.interval_s)

    def post_live(self, knobs: Mapping[str, Any]) -> None:
        """Apply live knobs as the profile says (an HTTP request or a control file);
        RuntimeBootError with the reason and the log tail when the runtime refuses them or
        never acknowledges them."""
        action = self.profile.live_apply()
        if not knobs or action is None:
            return
        self._send_live(action, dict(knobs), "live knobs")

    def reset_live(self, knobs: Mapping[str, Any]) -> None:
        """Take the runtime back to its boot state with the profile's ``live.reset``, carrying
        ``knobs`` (the next cell's settings, live file paths included); with no reset declared,
        apply them only."""
        live = self.profile.live
        if live is not None and live.reset is not None:
            self._send_live(live.reset, dict(knobs), "reset")
        else:
            self.post_live(knobs)

    def _send_live(self, action: LiveAction, knobs: dict[str, Any], what: str) -> None:
        self.live_seq += 1
        seq = str(self.live_seq)
        if action.http is not None:
            body = action.http.body.replace("{knobs}", json.dumps(knobs)).replace("{seq}", seq)
            # A dead runtime's refusal stays an OSError: a phase tag sent to it is let pass.
            status, answer = http_request(
                self.base_url + action.http.path,
                action.http.method,
                body.encode(),
                headers=self.admin_headers,
            )
            if not 200 <= status < 300:
                raise RuntimeBootError(
                    f"{what} {knobs} rejected: HTTP {status}: {answer}; "
                    f"log tail:\n{self.log_tail()}"
                )
            return
        assert action.file is not None
        spec = action.file
        path = render(spec.path, {"run_dir": self.spec.run_dir, "port": self.spec.port})
        text = spec.body.replace("{knobs}", json.dumps(knobs)).replace("{seq}", seq)
        # Only what the runtime logs after this write acknowledges it (not an older change's).
        logged_before = len(self.box.read_text(self.spec.log_path))
        with tempfile.TemporaryDirectory() as folder:
            local = Path(folder) / "control"
            local.write_text(text, encoding="utf-8")
            # Renamed into place, so the runtime never reads half a file.
            self.box.put_file(local, path + ".part")
        self.box.sh(shell_command(["mv", "-f", path + ".part", path]))
        if spec.signal is not None:
            self.box.signal_group(self.pgid, spec.signal)
        ack = re.compile(spec.ack_log_line.replace("{seq}", seq))
        reject = (
            re.compile(spec.reject_log_line.replace("{seq}", seq)) if spec.reject_log_line else None
        )
        deadline = time.monotonic() + spec.timeout_s
        while True:
            log = self.box.read_text(self.spec.log_path)[logged_before:]
            if ack.search(log):
                return
            refused = reject.search(log) if reject is not None else None
            if refused is not None:
                reason = refused.group(1) if refused.groups() else refused.group(0)
                raise RuntimeBootError(
                    f"{what} {knobs} rejected through {path}: {reason}; "
                    f"log tail:\n{self.log_tail()}"
                )
            if not self.box.group_alive(self.pgid):
                raise RuntimeBootError(
                    f"{what} {knobs}: the runtime exited; log tail:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeBootError(
                    f"{what} {knobs} written to {path} but not acknowledged within "
                    f"{spec.timeout_s:g} s (no log line matching {ack.pattern!r}); "
                    f"log tail:\n{self.log_tail()}"
                )
            time.sleep(spec.interval_s)

    def stop(self) -> bool:
        """Signal the process group, wait the grace period, then SIGKILL; True if it is gone."""
        try:
            return stop_group(self.box, self.profile, self.pgid)
        finally:
            self.box.release_http(self.spec.port)  # its tunnel, on an SSH box


def stop_group(box: Box, profile: RuntimeProfile, pgid: int) -> bool:
    """Stop a runtime's process group as its profile says: the stop signal, the grace period,
    then SIGKILL; True when no process of the group is left."""
    if not box.group_alive(pgid):
        return True
    box.signal_group(pgid, profile.stop.signal)
    if box.wait_group_gone(pgid, profile.stop.grace_s):
        return True
    box.signal_group(pgid, "KILL")
    return box.wait_group_gone(pgid, 5.0)


def boot(
    box: Box,
    profile: RuntimeProfile,
    spec: BootSpec,
    on_started: Callable[[int], None] | None = None,
) -> RunningRuntime:
    """Start the runtime in the background and wait until it is ready.

    ``on_started`` gets the process group as soon as it exists, before the (possibly long)
    readiness wait, so a caller can journal it: a harness killed mid-boot leaves a runtime too.
    A stop signal (:mod:`.interrupts`) arriving while the runtime starts is raised after
    ``on_started`` has run, so the caller always has the group to stop.
    """
    box.mkdirs(spec.run_dir)
    if profile.admin_token_env:
        # A fresh token per boot: only this harness can change what this runtime runs.
        spec.env[profile.admin_token_env] = secrets.token_hex(16)
    # A stop signal between the start and ``on_started`` would leave a runtime nobody knows of.
    with deferred():
        pgid = box.start_background(spec.argv, spec.env, spec.cwd, spec.log_path)
        if on_started is not None:
            on_started(pgid)
    runtime = RunningRuntime(
        box=box,
        profile=profile,
        spec=spec,
        pgid=pgid,
        base_url="",
    )
    try:
        runtime.base_url = box.http_base(spec.port)  # an SSH box's tunnel; inside the try
        runtime.wait_ready()
    except BaseException:
        runtime.stop()
        raise
    return runtime


def _box_shell_path(path: str) -> str:
    """A profile's path quoted for the box's shell. ``~/`` expands there, and so does a path
    with ``$`` (``${HARNESS_CACHE:-$HOME/.cache/harness}/…``, the cache a build script used),
    inside double quotes: the profile's boot command already runs there, so this trusts nothing
    new."""
    if "$" not in path:
        return quote_path(path)
    if path.startswith("~/"):
        path = "$HOME/" + path[2:]
    escaped = path.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`")
    return f'"{escaped}"'


def runtime_version(box: Box, profile: RuntimeProfile, python: str) -> dict[str, Any]:
    """The runtime's version text and binary SHA-256, as far as the profile says how."""
    out: dict[str, Any] = {"profile": profile.name}
    context = {"python": python}
    if profile.version.command:
        argv = [render(item, context) for item in profile.version.command]
        result = box.sh(shell_command(argv) + " 2>&1", check=False, timeout_s=60)
        out["version"] = result.stdout.strip()[:2000]
    binary, path = profile.version.binary, ""
    if binary is not None:
        path = _box_shell_path(binary)
    elif profile.boot.command:
        binary = render(profile.boot.command[0], context)
        path = quote_path(binary)  # an argv item, never expanded at boot either
    if binary:
        resolved = (
            box.sh(f"command -v {path} || printf '%s\\n' {path}", check=False).stdout.strip()
            or binary
        )
        out["binary"] = resolved
        out["binary_sha256"] = box.sha256(resolved)
    return out
