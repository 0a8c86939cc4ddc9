"""SGLang's released sources judge the flags the sglang profile sends.

No SGLang server runs on a CPU, but its server arguments are declared as annotated fields of
dataclasses (sglang 0.5.23: ``srt/arg_groups/fields/*.py``; a field ``tp_size`` is the flag
``--tp-size``, ``Arg(aliases=[...])`` adds others). The released wheel is downloaded once
(``pip download --no-deps``, into the harness cache) and its declarations are read with
``ast`` at run time: a profile flag no field declares is one a current build refuses at boot
(``--enable-expert-distribution-metrics`` was, until this test). Nothing of theirs is copied.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile

import pytest
import yaml

from harness.runtimes.build_script import cache_root
from tests.conftest import REPO

pytestmark = pytest.mark.slow

RELEASE = "sglang==0.5.23"
DECLARING = ("sglang/srt/arg_groups/", "sglang/srt/server_args.py")


@pytest.fixture(scope="module")
def declared_flags() -> set[str]:
    """Every flag the released build's argument dataclasses declare."""
    folder = cache_root() / "sglang-wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("sglang-0.5.23-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", RELEASE,
             "-d", str(folder)],
            check=True, timeout=900,
        )  # fmt: skip
        found = sorted(folder.glob("sglang-0.5.23-*.whl"))
    flags: set[str] = set()
    with zipfile.ZipFile(found[0]) as wheel:
        for member in wheel.namelist():
            if not member.endswith(".py") or not member.startswith(DECLARING):
                continue
            for node in ast.walk(ast.parse(wheel.read(member))):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    flags.add("--" + node.target.id.replace("_", "-"))
                elif (
                    isinstance(node, ast.keyword)
                    and node.arg == "aliases"
                    and isinstance(node.value, ast.List)
                ):
                    flags.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
    assert "--tp-size" in flags and "--expert-distribution-recorder-mode" in flags
    return flags


def test_every_flag_of_the_sglang_profile_is_one_the_release_declares(
    declared_flags: set[str],
) -> None:
    profile = yaml.safe_load(
        (REPO / "harness/profiles/data/runtimes/sglang.yaml").read_text(encoding="utf-8")
    )
    sent = {spec[key] for spec in profile["knobs"].values() for key in ("arg", "off_arg")
            if spec.get(key)}  # fmt: skip
    sent |= {route.split(":", 1)[1] for route in profile["files"].values()
             if route.startswith("arg:")}  # fmt: skip
    assert sent - declared_flags == set()
    # The flag 0.5.23 dropped, and what replaced it.
    assert "--enable-expert-distribution-metrics" not in declared_flags
    assert "--expert-balancedness-report-mode" in sent
