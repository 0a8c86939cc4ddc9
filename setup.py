"""Packaging hook: the report templates live at the top level (``templates/``, beside
``campaigns/`` and ``reports/``) and are copied into the wheel as ``harness/templates``."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithTemplates(build_py):
    """build_py, then the top-level templates into the built package."""

    def run(self) -> None:
        super().run()
        source = Path(__file__).resolve().parent / "templates"
        target = Path(self.build_lib) / "harness" / "templates"
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(source.glob("*.j2")):
            shutil.copy2(path, target / path.name)


setup(cmdclass={"build_py": BuildWithTemplates})
