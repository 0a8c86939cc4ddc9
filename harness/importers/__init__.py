"""Results other tools wrote, read as blocks of a campaign (``harness import``).

One small module per format (``vllm``, ``ds4``, ``llamabench``…), each returning a
:class:`~harness.importers.common.SourceBlock`; ``mapping`` places files in the mirrored order;
``write`` makes the campaign directory that analysis, gates and the report read unchanged.

Nothing is imported here: the CLI registers ``import`` without loading pandas, so import what
you use from its module (``harness.importers.write``, ...).
"""
