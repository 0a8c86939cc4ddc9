"""``.pt`` files against real torch, both ways: a file torch saved reads here, and the files we
write (the reference runtime's SGLang recorder dumps included) load in ``torch.load(weights_only=
True)`` with the same arrays.

Real torch is the one in vLLM's venv (``make vllm``: ``~/.cache/harness/vllm``), or
``$HARNESS_TORCH_PYTHON``. These tests build that venv when no interpreter has torch (as the
vLLM tests do, and in their group, so two workers never build into one cache), unless
``HARNESS_VLLM_NO_BUILD=1``; then they skip and say how to build. tests/formats/test_torchfile.py
has the reader and writer against each other and the refusals, without torch.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from harness.drive.response_routes import RouteRows, decode_routes, placeholder_layers
from harness.formats.expert_distribution import combine_dumps, read_dump
from harness.formats.maps import read_count_dump
from harness.formats.torchfile import read_torch_file, write_torch_file
from harness.profiles.telemetry import ResponseRoutesSpec
from harness.refbox.recorder import ExpertRecorder
from harness.runtimes.vllm import build

pytestmark = pytest.mark.slow


def _python_with_torch() -> str | None:
    """An interpreter that imports torch: $HARNESS_TORCH_PYTHON, else vLLM's venv(s)."""
    root = build.cache_root() / "vllm"
    candidates = [os.environ.get("HARNESS_TORCH_PYTHON", ""), str(root / "venv/bin/python")]
    candidates += sorted(str(p) for p in root.glob("*/venv/bin/python"))
    for python in candidates:
        if python and Path(python).is_file():
            done = subprocess.run(
                [python, "-c", "import torch"], capture_output=True, timeout=120, check=False
            )
            if done.returncode == 0:
                return python
    return None


@pytest.fixture(scope="module")
def torch_python() -> str:
    python = _python_with_torch()
    if python is None:
        if os.environ.get("HARNESS_VLLM_NO_BUILD") == "1":
            pytest.skip("no interpreter with torch: run `make vllm` or set HARNESS_TORCH_PYTHON")
        build.ensure_built()
        python = _python_with_torch()
    assert python is not None, "vLLM's venv was built but its python does not import torch"
    return python


def _torch(python: str, code: str, *args: str) -> str:
    done = subprocess.run(
        [python, "-c", code, *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


LOAD_AS_JSON = (
    "import sys, json, torch\n"
    "d = torch.load(sys.argv[1], weights_only=True)\n"
    "print(json.dumps({k: (str(v.dtype), list(v.shape), v.tolist())\n"
    "  if isinstance(v, torch.Tensor) else repr(v) for k, v in d.items()}))\n"
)


def test_a_file_real_torch_saved_reads_here(torch_python: str, tmp_path: Path) -> None:
    path = tmp_path / "torch.pt"
    _torch(
        torch_python,
        "import sys, collections, torch\n"
        "base = torch.arange(60, dtype=torch.int32).reshape(3, 4, 5)\n"
        "torch.save({'rank': 0, 'logical_count': base,\n"
        "  'gpu_expert_masks': (base % 2 == 0),\n"
        "  'view': base[1:, :, 2:],  # storage offset and strides of a view\n"
        "  'f': torch.tensor([[1.5, 2.5]], dtype=torch.float64).t(),\n"
        "  'od': collections.OrderedDict(a=1), 'avg': None, 'x': 0.25}, sys.argv[1])\n",
        str(path),
    )
    back = read_torch_file(path)
    base = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    assert back["logical_count"].dtype == np.int32
    assert np.array_equal(back["logical_count"], base)
    assert np.array_equal(back["gpu_expert_masks"], base % 2 == 0)
    assert np.array_equal(back["view"], base[1:, :, 2:])
    assert np.array_equal(back["f"], np.array([[1.5], [2.5]]))
    assert back["od"] == {"a": 1} and back["avg"] is None and back["x"] == 0.25


def test_our_file_loads_in_real_torch_weights_only_with_equal_arrays(
    torch_python: str, tmp_path: Path
) -> None:
    path = tmp_path / "ours.pt"
    counts = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)
    masks = counts % 3 == 0
    write_torch_file(
        path,
        {
            "rank": 0,
            "logical_count": counts,
            "gpu_expert_masks": masks,
            "scalar": np.array(9, dtype=np.int64),
            "f": np.array([0.5, 1.25], dtype=np.float32),
            "average_utilization_rate_over_window": None,
            "meta": {"list": [1, "a", 2.5], "tuple": (3, 4)},
        },
    )
    got = json.loads(_torch(torch_python, LOAD_AS_JSON, str(path)))
    assert got["logical_count"] == ["torch.int32", [2, 3, 4], counts.tolist()]
    assert got["gpu_expert_masks"] == ["torch.bool", [2, 3, 4], masks.tolist()]
    assert got["scalar"] == ["torch.int64", [], 9]
    assert got["f"] == ["torch.float32", [2], [0.5, 1.25]]
    assert got["rank"] == "0" and got["average_utilization_rate_over_window"] == "None"
    assert got["meta"] == repr({"list": [1, "a", 2.5], "tuple": (3, 4)})


def test_the_reference_runtimes_recorder_dump_loads_in_real_torch(
    torch_python: str, tmp_path: Path
) -> None:
    # The recorder the reference runtime serves SGLang's endpoints with: two passes of routes
    # (tokens, layers, top-k) and the hot experts each began with, dumped as SGLang writes it.
    recorder = ExpertRecorder(layers=2, experts=6, masks=True)
    recorder.start()
    recorder.add(np.array([[[0, 1], [2, 3]], [[0, 5], [2, 4]]]), [[0, 1], [2]])
    recorder.add(np.array([[[4, 1], [3, 5]]]), [[1, 4], [3, 5]])
    recorder.stop()
    # Two files, as KTransformers' SGLang build writes them (dump_record in its
    # eplb/expert_distribution.py): the counts, and gpu_expert_distribution_<t>.pt beside.
    path, masks_path = map(Path, recorder.dump(str(tmp_path / "dumps")))
    assert path.name.startswith("expert_distribution_recorder_") and path.suffix == ".pt"
    assert masks_path.name.startswith("gpu_expert_distribution_")
    got = json.loads(_torch(torch_python, LOAD_AS_JSON, str(path)))
    got_masks = json.loads(_torch(torch_python, LOAD_AS_JSON, str(masks_path)))
    ours = combine_dumps([read_dump(path), read_dump(masks_path)], "dumps")
    assert ours.masks is not None
    assert got["logical_count"] == ["torch.int32", [2, 2, 6], ours.counts.tolist()]
    assert set(got_masks) == {"gpu_expert_masks"}
    assert got_masks["gpu_expert_masks"] == ["torch.bool", [2, 2, 6], ours.masks.tolist()]
    assert got["rank"] == "0" and got["average_utilization_rate_over_window"] == "None"
    assert ours.counts[0].tolist() == [[2, 1, 0, 0, 0, 1], [0, 0, 2, 1, 1, 0]]
    hot_layer_0 = [False, True, False, False, True, False]  # experts 1 and 4
    hot_layer_1 = [False, False, False, True, False, True]  # experts 3 and 5
    assert ours.masks[1].tolist() == [hot_layer_0, hot_layer_1]


VLLM_ROUTES = (
    "import sys, numpy as np\n"
    "from vllm.utils.serial_utils import numpy2base64\n"
    "rows = np.array([[[0, 0], [1, 4], [2, 5]], [[0, 0], [3, 1], [0, 2]],\n"
    "                 [[0, 0], [5, 4], [1, 3]]], dtype=np.int16)\n"
    "print(numpy2base64(rows))\n"
)


def test_vllms_own_serializer_of_a_dense_prefix_model_reads_as_its_routed_layers(
    torch_python: str, tmp_path: Path
) -> None:
    # vLLM 0.32's completion serving puts numpy2base64(output.routed_experts) in each choice;
    # a model with a dense first layer (DeepSeek's shape) leaves that layer's rows zeros.
    encoded = _torch(torch_python, VLLM_ROUTES).strip()
    body = {"choices": [{"routed_experts": encoded}]}
    spec = ResponseRoutesSpec(knob="return_routed_experts")
    array = decode_routes(body, spec, 3, "request 1", top_k=2)
    assert array.dtype == np.int16 and placeholder_layers(array) == (0,)
    rows = RouteRows(model_layers=3, dense_layers=(0,))
    rows.add(np.delete(array, 0, axis=1), prompt_tokens=2)
    counts_path, trace_path = rows.write(tmp_path, width=6)
    with np.load(trace_path) as saved:
        assert saved["routed_experts"][:, 0, :].tolist() == [[1, 4], [3, 1], [5, 4]]
        assert saved["dense_layers"].tolist() == [0]
    assert read_count_dump(counts_path)[0].sum() == 0
