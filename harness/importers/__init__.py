"""Results other tools wrote, read as blocks of a campaign (``harness import``).

One small module per format (``vllm``, ``ds4``, ``llamabench``…), each returning a
:class:`~harness.importers.common.SourceBlock`; ``mapping`` places files in the mirrored order;
``write`` makes the campaign directory that analysis, gates and the report read unchanged.
"""

from __future__ import annotations

from harness.importers.common import SourceBlock
from harness.importers.write import FORMATS, ImportResult, import_results, read_source

__all__ = ["FORMATS", "ImportResult", "SourceBlock", "import_results", "read_source"]
