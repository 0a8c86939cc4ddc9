"""Routing returned in whole responses (vLLM's and SGLang's --enable-return-routed-experts), for
real on the reference runtime: `harness collect --routes-from-responses` keeps each response's
routing as a trace, which must hold exactly the rows the runtime's own route trace logged for the
same requests; what a response that lacks or garbles its routing gets; and the bad inputs
refused. The reference runtime stands in for both engines here, in each one's format: vLLM 0.32
returns routing only with Model Runner V2, which needs Triton, and its CPU build refuses to boot
with it (vllm/entrypoints/openai/completion/serving.py: numpy2base64 of the .npy bytes, in each
choice); SGLang needs a GPU (entrypoints/openai/serving_completions.py: the response's
`sglext.routed_experts`, base64 of flat int32, only to a request with return_routed_experts)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest

from harness.drive.response_routes import RouteRows, decode_routes, placeholder_layers
from harness.errors import BadInput, InfrastructureError
from harness.formats.maps import read_count_dump
from harness.profiles.telemetry import ResponseRoutesSpec
from harness.sim.fitmap import coverage, frequency_hot, load_counts
from harness.sim.trace_files import load_trace
from tests.conftest import REPO, run_cli

SPEC = ResponseRoutesSpec(knob="return_routed_experts")


def _card(tmp_path: Path, name: str = "demo.yaml") -> Path:
    """A shipped card (the demo's, on the refbox), with its prompts beside it."""
    folder = tmp_path / "cards"
    folder.mkdir()
    for files in ("prompts", "maps"):
        (folder / files).symlink_to(REPO / "campaigns" / files)
    card = folder / name
    card.write_text((REPO / "campaigns" / name).read_text(encoding="utf-8"))
    return card


def _engine_rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The runtime's own route trace as rows: every forwarded token's experts, and prefill."""
    rows: list[list[list[int]]] = []
    prefill: list[bool] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["kind"] != "step":
            continue
        tokens = record["experts"] if record["prefill"] else [record["experts"]]
        rows += tokens
        prefill += [record["prefill"]] * len(tokens)
    return np.array(rows), np.array(prefill)


@pytest.mark.slow
def test_collected_routing_is_the_routing_the_runtime_ran(tmp_path: Path) -> None:
    card, out = _card(tmp_path), tmp_path / "held"
    result = run_cli(
        "collect", str(card), "--split", "heldout", "--domains", "agent", "--max-tokens", "6",
        "--routes-from-responses", "-o", str(out), timeout_s=300,
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    assert f"route trace: {out / 'route-trace.npz'}" in result.stdout
    with np.load(out / "route-trace.npz") as saved:
        experts, prefill, steps = saved["routed_experts"], saved["prefill"], saved["step"]
    engine_experts, engine_prefill = _engine_rows(out / "route-trace.jsonl")
    assert np.array_equal(experts, engine_experts) and np.array_equal(prefill, engine_prefill)
    # Each request: its prompt one step, then 5 decode steps (6 tokens, the last not forwarded).
    requests = int(result.stdout.split()[0])
    assert requests > 0 and steps[-1] == requests * 6 - 1
    assert (np.diff(steps) >= 0).all() and (steps[~prefill].size == requests * 5)
    counts = read_count_dump(out / "counts.json")
    assert counts.sum() == experts.size  # every row, prefill included
    assert (counts == np.stack([np.bincount(experts[:, i].ravel(), minlength=counts.shape[1])
                                for i in range(experts.shape[1])])).all()  # fmt: skip
    # What the simulator reads: the same rows, decode steps counted.
    trace = load_trace(out / "route-trace.npz", experts=64)
    assert trace.experts.shape == experts.shape and int((~trace.prefill).sum()) == requests * 5
    scored = run_cli(
        "fit-map", str(out / "counts.json"), "--top", "16", "--experts", "64",
        "--score", str(out / "route-trace.npz"), "--in-sample", "-o", str(tmp_path / "m.json"),
    )  # fmt: skip
    assert scored.code == 0, scored.stdout + scored.stderr


def test_a_runtime_that_returns_no_routing_is_refused_naming_the_profile(tmp_path: Path) -> None:
    card = _card(tmp_path)
    profile = (REPO / "harness/profiles/data/runtimes/refbox.yaml").read_text(encoding="utf-8")
    assert "  response_routes: {knob: return_routed_experts}\n" in profile
    plain = profile.replace("  response_routes: {knob: return_routed_experts}\n", "")
    (card.parent / "runtimes").mkdir()
    (card.parent / "runtimes" / "refbox-plain.yaml").write_text(
        plain.replace("name: refbox\n", "name: refbox-plain\n"), encoding="utf-8"
    )
    text = card.read_text(encoding="utf-8")
    card.write_text(text.replace("runtime: refbox", "runtime: refbox-plain"), encoding="utf-8")
    result = run_cli("collect", str(card), "--routes-from-responses", "-o", str(tmp_path / "o"))
    assert result.code == 2 and "declares no telemetry.response_routes" in result.stderr
    assert "Traceback" not in result.stderr


def test_routes_from_responses_cannot_send_a_runs_workload(tmp_path: Path) -> None:
    result = run_cli(
        "collect", str(_card(tmp_path)), "--as-run", "--routes-from-responses", "-o",
        str(tmp_path / "o"),
    )  # fmt: skip
    assert result.code == 2 and "drop --as-run" in result.stderr


def _npy(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.slow
def test_sglangs_flat_routing_asked_per_request_is_the_routing_the_runtime_ran(
    tmp_path: Path,
) -> None:
    # The reference runtime in SGLang's dialect answers only a request that asks, so the rows
    # arriving at all shows the profile's request_fields were sent.
    card, out = _card(tmp_path, "sglang-kt-refbox.yaml"), tmp_path / "held"
    result = run_cli(
        "collect", str(card), "--split", "heldout", "--domains", "agent", "--max-tokens", "4",
        "--routes-from-responses", "--top-k", "4", "--experts", "64", "-o", str(out),
        timeout_s=300,
    )  # fmt: skip
    assert result.code == 0, result.stdout + result.stderr
    with np.load(out / "route-trace.npz") as saved:
        experts, prefill = saved["routed_experts"], saved["prefill"]
    engine_experts, engine_prefill = _engine_rows(out / "route-trace.jsonl")
    assert np.array_equal(experts, engine_experts) and np.array_equal(prefill, engine_prefill)
    counts = read_count_dump(out / "counts.json")
    assert counts.shape == (8, 64) and counts.sum() == experts.size
    # A --top-k that does not divide the rows is the user's to fix: exit 2, naming the flag.
    wrong = run_cli(
        "collect", str(card), "--split", "heldout", "--domains", "agent", "--max-tokens", "4",
        "--routes-from-responses", "--top-k", "3", "-o", str(tmp_path / "wrong"), timeout_s=300,
    )  # fmt: skip
    assert wrong.code == 2 and "num_experts_per_tok" in wrong.stderr, wrong.stderr


def test_flat_routing_needs_top_k_and_shapes_need_routes_from_responses(tmp_path: Path) -> None:
    card = _card(tmp_path, "sglang-kt-refbox.yaml")
    result = run_cli("collect", str(card), "--routes-from-responses", "-o", str(tmp_path / "o"))
    assert result.code == 2 and "give --top-k" in result.stderr, result.stderr
    result = run_cli("collect", str(card), "--experts", "64", "-o", str(tmp_path / "o"))
    assert result.code == 2 and "need --routes-from-responses" in result.stderr, result.stderr
    result = run_cli("collect", str(card), "--top-k", "0", "-o", str(tmp_path / "o"))
    assert result.code == 2 and "must be 1 or more" in result.stderr, result.stderr


SGLANG = ResponseRoutesSpec(
    knob="return_routed_experts",
    field="sglext.routed_experts",
    encoding="int32-base64",
    request_fields={"return_routed_experts": True},
)


def _flat(array: np.ndarray) -> dict[str, object]:
    raw = base64.b64encode(array.astype("<i4").tobytes()).decode()
    return {"sglext": {"routed_experts": raw}}


def test_sglangs_flat_int32_splits_into_rows_layers_and_top_k() -> None:
    routes = np.arange(5 * 3 * 2).reshape(5, 3, 2) % 17
    got = decode_routes(_flat(routes), SGLANG, 5, "request 1", top_k=2)
    assert got.shape == (5, 3, 2) and np.array_equal(got, routes)
    with pytest.raises(BadInput, match="do not split into 5 rows"):
        decode_routes(_flat(routes), SGLANG, 5, "request 1", top_k=4)
    with pytest.raises(InfrastructureError, match="not a whole number of int32"):
        decode_routes({"sglext": {"routed_experts": "AAAA"}}, SGLANG, 1, "r", top_k=1)
    with pytest.raises(BadInput, match="2 experts per token, not --top-k 3"):
        decode_routes({"choices": [{"routed_experts": _npy(routes)}]}, SPEC, 5, "r", top_k=3)


def test_a_dense_prefix_is_a_placeholder_and_stray_repeats_are_refused() -> None:
    routes = np.arange(4 * 3 * 2).reshape(4, 3, 2) % 11
    dense = routes.copy()
    dense[:, 0, :] = 0  # SGLang's capture buffer is zeros where no MoE layer writes
    assert placeholder_layers(decode_routes(_flat(dense), SGLANG, 4, "request 2", top_k=2)) == (0,)
    dense[:, 0, :] = -1  # sglang-jax's placeholder
    assert placeholder_layers(decode_routes(_flat(dense), SGLANG, 4, "request 2", top_k=2)) == (0,)
    # Zeros in some rows of a routed layer are no placeholder: refused, naming the layer.
    partial = routes.copy()
    partial[1, 2, :] = 0
    with pytest.raises(InfrastructureError, match=r"row 1, layer 2 picks \[0, 0\].*layers \[2\]"):
        decode_routes(_flat(partial), SGLANG, 4, "request 2", top_k=2)
    partial[1, 2, :] = -1
    with pytest.raises(InfrastructureError, match="negative id is no routed expert"):
        decode_routes(_flat(partial), SGLANG, 4, "request 2", top_k=2)


def test_dense_layers_leave_the_trace_and_stay_in_the_counts_as_zero_rows(tmp_path: Path) -> None:
    # A DeepSeek-shaped response: layer 0 dense (zeros), layers 1-2 routed, top-2 of 6.
    routes = np.array([[[0, 0], [1, 4], [2, 5]], [[0, 0], [3, 1], [0, 2]]])
    rows = RouteRows(model_layers=3, dense_layers=placeholder_layers(routes))
    assert rows.dense_layers == (0,) and rows.moe_layers == [1, 2]
    rows.add(np.delete(routes, rows.dense_layers, axis=1), prompt_tokens=1)
    counts_path, trace_path = rows.write(tmp_path, width=6)
    with np.load(trace_path) as saved:
        assert saved["routed_experts"].shape == (2, 2, 2)
        assert saved["dense_layers"].tolist() == [0] and saved["moe_layers"].tolist() == [1, 2]
    trace = load_trace(trace_path, experts=6)
    assert trace.layers == 2
    counts = read_count_dump(counts_path)
    assert counts.shape == (3, 6) and counts[0].sum() == 0  # num_hidden_layers rows
    assert counts[1].tolist() == [0, 2, 0, 1, 1, 0] and counts[2].tolist() == [1, 0, 2, 0, 0, 1]
    # Fitting from the trace (its decode row) gives model-shaped counts too, and a
    # model-shaped map scores the trace on its routed layers.
    fitted = load_counts(trace_path, experts=6).counts
    assert fitted.tolist() == [[0] * 6, [0, 1, 0, 1, 0, 0], [1, 0, 1, 0, 0, 0]]
    hot = frequency_hot(counts, 2)
    scored = coverage(trace, hot=hot)  # the decode row: 2 routed layers x top-2
    assert hot[0] == [] and scored.selections == 4 and scored.per_layer.size == 2


def test_a_response_without_routing_or_with_garbled_routing_says_which_and_why() -> None:
    good = (np.arange(5 * 2 * 3).reshape(5, 2, 3) % 7).astype(np.uint8)
    cases = {
        "has no `choices.0.routed_experts`": {"choices": [{"text": "x"}]},
        "not base64": {"choices": [{"routed_experts": "%%%"}]},
        "is list, not base64": {"choices": [{"routed_experts": [1, 2]}]},
        "expected 5 integer rows": {"choices": [{"routed_experts": _npy(good[:4])}]},
    }
    for message, body in cases.items():
        with pytest.raises(InfrastructureError, match="request 3") as caught:
            decode_routes(body, SPEC, 5, "request 3")
        assert message in str(caught.value)
    floats = {"choices": [{"routed_experts": _npy(good.astype(np.float32))}]}
    with pytest.raises(InfrastructureError, match="integer rows"):
        decode_routes(floats, SPEC, 5, "request 3")
    assert decode_routes({"choices": [{"routed_experts": _npy(good)}]}, SPEC, 5, "r").shape == (
        5,
        2,
        3,
    )


def test_route_rows_number_one_prefill_step_then_one_step_per_decode_row(tmp_path: Path) -> None:
    rows = RouteRows()
    rows.add(np.ones((4, 1, 2), dtype=np.uint8), prompt_tokens=3)  # 3 prompt rows, 1 decode
    rows.add(np.ones((1, 1, 2), dtype=np.uint8), prompt_tokens=2)  # nothing generated
    _, trace = rows.write(tmp_path)
    with np.load(trace) as saved:
        assert saved["step"].tolist() == [0, 0, 0, 1, 2]
        assert saved["prefill"].tolist() == [True, True, True, False, True]


def test_an_id_past_any_model_is_refused_before_the_counts_are_sized_by_it() -> None:
    # Without --experts the counts are sized by the largest id: one id of 2**62 once asked for
    # GiBs. Refused naming the request, with the fix.
    from harness.drive.response_routes import check_ids

    huge = np.array([[[1, 2**62]]], dtype=np.int64)
    array = decode_routes({"choices": [{"routed_experts": _npy(huge)}]}, SPEC, 1, "request 1")
    with pytest.raises(InfrastructureError, match=r"request 1: .* past any model's \(4096\)"):
        check_ids(array, None, "request 1")
    with pytest.raises(BadInput, match="past --experts 64"):
        check_ids(array, 64, "request 1")
    check_ids(np.array([[[1, 63]]]), 64, "request 1")  # within the model: fine


def test_a_npy_whose_header_claims_more_than_it_holds_is_refused_before_numpy_allocates() -> None:
    # A header claiming 64 PiB in a response's `routed_experts` reached the last-resort handler
    # as a MemoryError ("a harness bug"); the header is now held to the bytes first.
    header = {"descr": "<i4", "fortran_order": False, "shape": (2**22, 2**22, 2**10)}
    handle = io.BytesIO()
    np.lib.format.write_array_header_1_0(handle, header)
    raw = base64.b64encode(handle.getvalue() + b"\0" * 16).decode()
    with pytest.raises(InfrastructureError, match=r"its header says \[4194304, 4194304, 1024\]"):
        decode_routes({"choices": [{"routed_experts": raw}]}, SPEC, 5, "r", top_k=3)
