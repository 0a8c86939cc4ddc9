"""Bad input gets one of our errors (exit 2 at the CLI), never a traceback.

Every shipped input kind is mutated the ways real files go bad: cut short, bytes flipped, not
UTF-8, NUL bytes, YAML tags and alias bombs, numbers too large for any type, a value of the wrong
type, nesting deeper than a parser's stack, lines lost or repeated. Each mutated file goes
through its real reader (and what the verb that reads it does next); the only exceptions allowed
out are :class:`HarnessError` subclasses. A few examples of each kind go through the real CLI,
which must exit 2 with no traceback.

Deterministic: derandomized examples and no example database, so CI sees the same inputs every
run. ``HARNESS_BAD_INPUT_EXAMPLES=N`` raises the in-process example count for a local survey.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.analyze.campaign import analyze_campaign, write_analysis
from harness.card import load_boxes_file, load_card, load_runtime_profile
from harness.card.frozen import freeze_inputs, frozen_paths, load_frozen_card
from harness.errors import EXIT_BAD_INPUT, HarnessError
from harness.formats.expert_distribution import read_dump, read_logical_count, write_stat_dump
from harness.formats.maps import read_count_snapshot, read_hotlist, read_rowmap, write_count_dump
from harness.formats.prompts import load_pool
from harness.formats.records import Journal
from harness.formats.ring import RING_FIELDS, RingGeometry, RingWriter
from harness.formats.ring_read import describe_ring, read_ring_since
from harness.plan.build import build_plan, plan_json_text
from harness.policy.residency import PolicyKnobs
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.model import ModelConfig
from harness.sim.fitmap import fit_hotlist_entries, fit_top_k, load_counts
from harness.sim.trace_files import load_trace
from harness.sim.traces import decode_counts
from tests.conftest import DATA, REPO, run_cli

EXAMPLES = int(os.environ.get("HARNESS_BAD_INPUT_EXAMPLES", "0"))


def _settings(examples: int) -> settings:
    return settings(
        max_examples=max(examples, EXAMPLES),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------------------------------------
# Mutations: each is a name (printed when an example fails) and a function of the file's bytes.


@dataclass(frozen=True)
class Mutation:
    """One way a file went bad."""

    name: str
    apply: Callable[[bytes], bytes]

    def __repr__(self) -> str:
        return self.name


def _at(data: bytes, fraction: float) -> int:
    return min(len(data), int(len(data) * fraction))


INVALID_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\x80\x80"]
HUGE_NUMBERS = [
    b"9" * 5000,
    b"1" + b"0" * 400,
    b"18446744073709551616",
    b"-9223372036854775809",
    b"1e999",
    b"-1e999",
    b"NaN",
    b".nan",
    b"Infinity",
]
YAML_TAGS = [
    b"!!python/object/apply:os.system ['true'] ",
    b"!!python/object:os.system ",
    b"!!python/name:os.system ",
    b"!local ",
    b"!!binary ",
    b"!!set ",
    b"&anchor ",
    b"*anchor ",
]
# Aliases that expand 9^9 times: a loader that follows them blindly never finishes.
ALIAS_BOMB = b"".join(
    b"l%d: &l%d [%s]\n" % (i, i, b",".join([b"*l%d" % (i - 1)] * 9) if i else b"1,1,1,1,1,1,1,1,1")
    for i in range(9)
)
TOKENS = [
    *HUGE_NUMBERS,
    b"-1",
    b"0",
    b"[1, 2]",
    b"{a: 1}",
    b'{"a": 1}',
    b"[]",
    b"{}",
    b"null",
    b"true",
    b'"text"',
    b"",
]
WRONG_VALUES: list[Any] = [
    None,
    True,
    -1,
    0,
    2**64,
    10**400,
    float("inf"),
    float("nan"),
    "text",
    "",
    [],
    {},
    [1, [2, [3]]],
    {"k": "v"},
    0.5,
]
WORDS = [0, 1, -1, 2**31 - 1, 2**62, -(2**63), 2**63 - 1, 0x7FFF_FFFF_FFFF]


def _truncations() -> st.SearchStrategy[Mutation]:
    return st.floats(0, 1).map(lambda f: Mutation(f"truncate at {f:.3f}", lambda b: b[: _at(b, f)]))


def _flips() -> st.SearchStrategy[Mutation]:
    def flip(spots: list[tuple[float, int]]) -> Mutation:
        def apply(data: bytes) -> bytes:
            out = bytearray(data)
            for fraction, mask in spots:
                if out:
                    out[min(len(out) - 1, int(len(out) * fraction))] ^= mask
            return bytes(out)

        return Mutation(f"flip {spots}", apply)

    spot = st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255))
    return st.lists(spot, min_size=1, max_size=8).map(flip)


def _insertions(payloads: list[bytes]) -> st.SearchStrategy[Mutation]:
    def insert(args: tuple[float, bytes]) -> Mutation:
        fraction, payload = args
        return Mutation(
            f"insert {payload[:40]!r} at {fraction:.3f}",
            lambda b: b[: _at(b, fraction)] + payload + b[_at(b, fraction) :],
        )

    return st.tuples(st.floats(0, 1), st.sampled_from(payloads)).map(insert)


def _token_replacements(pattern: bytes) -> st.SearchStrategy[Mutation]:
    """Replace the n-th match of ``pattern`` (numbers, values) with another token."""

    def replace(args: tuple[int, bytes]) -> Mutation:
        index, token = args

        def apply(data: bytes) -> bytes:
            found = list(re.finditer(pattern, data))
            if not found:
                return data + token
            match = found[index % len(found)]
            return data[: match.start(1)] + token + data[match.end(1) :]

        return Mutation(f"replace match {index} of {pattern!r} with {token[:40]!r}", apply)

    return st.tuples(st.integers(0, 10_000), st.sampled_from(TOKENS)).map(replace)


def _line_edits() -> st.SearchStrategy[Mutation]:
    def edit(args: tuple[str, int, int]) -> Mutation:
        how, first, second = args

        def apply(data: bytes) -> bytes:
            lines = data.splitlines(keepends=True)
            if not lines:
                return data
            i, j = first % len(lines), second % len(lines)
            if how == "drop":
                del lines[i]
            elif how == "repeat":
                lines.insert(i, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            return b"".join(lines)

        return Mutation(f"{how} line {first} ({second})", apply)

    return st.tuples(
        st.sampled_from(["drop", "repeat", "swap"]), st.integers(0, 10_000), st.integers(0, 10_000)
    ).map(edit)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _replace_at(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    value[path[0]] = _replace_at(value[path[0]], path[1:], new)
    return value


def _structural(fmt: str) -> st.SearchStrategy[Mutation]:
    """Parse the document, put a value of another type somewhere in it, write it back."""

    def retype(args: tuple[int, int, Any]) -> Mutation:
        line_index, node_index, new = args

        def one(document: Any) -> Any:
            paths = list(_paths(document))
            return _replace_at(document, paths[node_index % len(paths)], new)

        def apply(data: bytes) -> bytes:
            if fmt == "yaml":
                text = yaml.safe_dump(one(yaml.safe_load(data)), sort_keys=False)
                return text.encode()
            if fmt == "json":
                return json.dumps(one(json.loads(data))).encode()
            lines = data.splitlines()
            i = line_index % len(lines)
            lines[i] = json.dumps(one(json.loads(lines[i]))).encode()
            return b"\n".join(lines) + b"\n"

        return Mutation(f"{fmt} node {node_index} (line {line_index}) := {new!r:.40}", apply)

    return st.tuples(
        st.integers(0, 10_000), st.integers(0, 10_000), st.sampled_from(WRONG_VALUES)
    ).map(retype)


def _deep(opening: bytes, closing: bytes) -> Mutation:
    return Mutation(
        f"nest {opening!r} 100000 deep",
        lambda b: b[: len(b) // 2] + opening * 100_000 + closing * 100_000 + b[len(b) // 2 :],
    )


def _words() -> st.SearchStrategy[Mutation]:
    """Overwrite an aligned 4- or 8-byte word (a header field, a count) with an extreme value."""

    def put(args: tuple[int, int, int]) -> Mutation:
        offset, width, value = args

        def apply(data: bytes) -> bytes:
            if len(data) < width:
                return data
            at = (offset * width) % (len(data) - width + 1)
            word = value % (1 << (8 * width))
            return data[:at] + word.to_bytes(width, "little") + data[at + width :]

        return Mutation(f"word {value} ({width} bytes) at {offset * width}", apply)

    return st.tuples(st.integers(0, 64), st.sampled_from([4, 8]), st.sampled_from(WORDS)).map(put)


def _common() -> list[st.SearchStrategy[Mutation]]:
    return [
        _truncations(),
        _flips(),
        _insertions(INVALID_UTF8),
        _insertions([b"\x00", b"\x00" * 8]),
        st.just(Mutation("empty file", lambda b: b"")),
    ]


NUMBER = rb"(-?\d+(?:\.\d+)?)"


def text_mutations(fmt: str) -> st.SearchStrategy[Mutation]:
    """Mutations of a text format: ``yaml``, ``json``, ``jsonl`` or ``text``."""
    options = [
        *_common(),
        _insertions(HUGE_NUMBERS),
        _token_replacements(NUMBER),
        _line_edits(),
    ]
    if fmt == "yaml":
        options += [
            _insertions(YAML_TAGS),
            _token_replacements(rb": ([^\s#][^\n#]*)"),
            st.just(Mutation("alias bomb first", lambda b: ALIAS_BOMB + b)),
            st.just(Mutation("alias loop", lambda b: b"loop: &x [*x]\n" + b)),
            st.just(Mutation("merge key", lambda b: b"base: &b {a: 1}\nother: {<<: *b}\n" + b)),
            st.just(_deep(b"[", b"]")),
            st.just(_deep(b"{a: ", b"}")),
        ]
    if fmt in ("yaml", "json", "jsonl"):
        options.append(_structural(fmt))
    if fmt in ("json", "jsonl"):
        options += [
            _token_replacements(rb':\s*("[^"]*"|[-\d.]+|true|false|null)'),
            st.just(_deep(b"[", b"]")),
            st.just(_deep(b'{"a":', b"}")),
        ]
    return st.one_of(*options)


def binary_mutations() -> st.SearchStrategy[Mutation]:
    """Mutations of a binary file: cut, flipped, padded, header words set to extremes."""
    return st.one_of(*_common(), _words(), _insertions([b"\x00" * 64, b"\xff" * 64]))


def _frame_edits() -> st.SearchStrategy[Mutation]:
    """A parquet table still readable but with a column dropped, retyped or emptied."""

    def edit(args: tuple[str, int]) -> Mutation:
        how, index = args

        def apply(data: bytes) -> bytes:
            frame = pd.read_parquet(io.BytesIO(data))
            column = frame.columns[index % len(frame.columns)]
            if how == "drop":
                frame = frame.drop(columns=[column])
            elif how == "strings":
                frame[column] = "x"
            elif how == "nulls":
                frame[column] = None
            elif how == "huge":
                frame[column] = np.float64(1e308) if frame[column].dtype.kind == "f" else 2**62
            else:
                frame = frame.iloc[0:0]
            out = io.BytesIO()
            frame.to_parquet(out, index=False)
            return out.getvalue()

        return Mutation(f"parquet: {how} column {index}", apply)

    hows = st.sampled_from(["drop", "strings", "nulls", "huge", "no rows"])
    return st.tuples(hows, st.integers(0, 100)).map(edit)


# ---------------------------------------------------------------------------------------------
# The inputs: every shipped kind, and generated ones for what the repository does not ship.


@dataclass(frozen=True)
class Input:
    """A file to mutate, its format, and what reads it (the reader and the verb's next steps)."""

    kind: str
    path: Path
    fmt: str  # yaml, json, jsonl, text, binary, parquet
    read: Callable[[Path], object]

    def __repr__(self) -> str:
        return f"{self.kind}:{self.path.name}"


SMALL_MODEL = ModelConfig(layers=3, experts=16, top_k=2, d_model=16, d_ff=16, seed=7)


def _read_card(path: Path) -> object:
    # What `harness validate` and `harness plan` do with a card.
    plan = build_plan(load_card(path))
    return plan_json_text(plan), round(plan.estimated_run_s()), round(plan.estimated_total_s())


def _read_counts(path: Path) -> object:
    read_count_snapshot(path)
    source = load_counts(path)
    return fit_top_k(source.counts, 2), fit_hotlist_entries(source.counts, 8)


def _read_trace(path: Path) -> object:
    trace = load_trace(path)
    return decode_counts(trace), decode_counts(trace, 16.0)


def _read_ring(path: Path) -> object:
    return describe_ring(path), read_ring_since(path, 0)


def _read_campaign(root: Path) -> Callable[[Path], object]:
    def read(_path: Path) -> object:
        journal = Journal(root / "journal.jsonl")
        journal.done_runs()
        return write_analysis(analyze_campaign(root))

    return read


def _read_frozen(root: Path) -> Callable[[Path], object]:
    def read(_path: Path) -> object:
        return load_frozen_card(root), frozen_paths(root, "pool")

    return read


def _write_trace(folder: Path) -> Path:
    path = folder / "route-trace.jsonl"
    engine = Engine(
        SMALL_MODEL,
        EngineOptions(
            hot_slots=4,
            knobs=PolicyKnobs(drain_every=2, promote_threshold=0.5),
            expert_bytes=0,
            cold_dir=str(folder),
            route_trace_path=str(path),
        ),
    )
    list(engine.generate(b"abc", 6))
    engine.set_knobs({"phase": 1, "hysteresis": 0.5})
    list(engine.generate(b"xy", 4))
    engine.close()
    return path


def _build_inputs(root: Path) -> dict[str, list[Input]]:
    campaigns = root / "campaigns"
    shutil.copytree(REPO / "campaigns", campaigns, ignore=shutil.ignore_patterns("models"))
    # The llama.cpp card's model is generated, not shipped; an empty stand-in lets its card
    # validate, so mutations reach past the missing-file check.
    (campaigns / "models").mkdir()
    (campaigns / "models" / "tiny-moe.gguf").write_bytes(b"")
    runtimes = root / "runtimes"
    shutil.copytree(REPO / "harness" / "profiles" / "data" / "runtimes", runtimes)
    generated = root / "generated"
    generated.mkdir()
    trace = _write_trace(generated)
    dump = generated / "expert_distribution_recorder_1.pt"  # SGLang's recorder, KT's masks
    counts = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)
    write_stat_dump(dump, counts, counts % 3 == 0)
    loaded = load_trace(trace)
    np.save(generated / "trace.npy", loaded.experts.astype(np.int64))
    np.savez(
        generated / "trace.npz",
        routed_experts=loaded.experts,
        phase=loaded.phase,
        prefill=loaded.prefill,
        step=loaded.steps,
    )
    megatron = generated / "megatron.jsonl"
    with megatron.open("w") as out:
        for row in range(min(40, loaded.rows)):
            for layer in range(loaded.layers):
                top = loaded.experts[row, layer].tolist()
                out.write(json.dumps({"step": row, "layer": layer, "top_indices": top}) + "\n")
    counts = generated / "counts.json"
    write_count_dump(counts, decode_counts(loaded).astype(np.int64), 1_796_119_760.0)
    ring = generated / "ring.bin"
    with RingWriter(ring, 16, RingGeometry(3, 16, 2, 4)) as writer:
        for index in range(24):  # wraps: 8 overwritten
            writer.append([index * 10 + field for field in range(len(RING_FIELDS))])
    campaign = root / "demo-shaped"
    shutil.copytree(DATA / "campaigns" / "demo-shaped", campaign)
    # A campaign directory with its inputs frozen, as `harness run` leaves it for --resume.
    frozen = root / "frozen"
    frozen.mkdir()
    freeze_inputs(load_card(campaigns / "demo.yaml"), frozen)
    run = campaign / "runs" / "0000-stale-c0-warm-s0-r0"
    read_campaign = _read_campaign(campaign)
    cards = sorted(p for p in campaigns.glob("*.yaml") if p.name != "boxes.yaml")
    return {
        "card": [Input("card", p, "yaml", _read_card) for p in cards],
        "boxes": [
            Input("boxes", campaigns / "boxes.yaml", "yaml", load_boxes_file),
        ],
        "runtime": [
            Input("runtime", p, "yaml", load_runtime_profile) for p in sorted(runtimes.glob("*"))
        ],
        "pool": [Input("pool", p, "jsonl", load_pool) for p in sorted(campaigns.glob("prompts/*"))],
        "rowmap": [
            Input("rowmap", p, "json", read_rowmap) for p in sorted(campaigns.glob("maps/*.json"))
        ],
        "hotlist": [
            Input("hotlist", p, "text", read_hotlist) for p in sorted(campaigns.glob("maps/*.txt"))
        ],
        "counts": [Input("counts", counts, "json", _read_counts)],
        "trace": [
            Input("trace", trace, "jsonl", _read_trace),
            Input("trace", megatron, "jsonl", _read_trace),
            Input("trace", generated / "trace.npy", "binary", _read_trace),
            Input("trace", generated / "trace.npz", "binary", _read_trace),
        ],
        "ring": [Input("ring", ring, "binary", _read_ring)],
        "torch": [
            Input(
                "torch", campaigns / "maps" / "kt-frequency-refbox.pt", "binary", read_logical_count
            ),
            Input("torch", dump, "binary", read_dump),
        ],
        "record": [
            Input("record", campaign / "plan.json", "json", read_campaign),
            Input("record", campaign / "card.yaml", "yaml", read_campaign),
            Input("record", campaign / "journal.jsonl", "jsonl", read_campaign),
            Input("record", run / "run.json", "json", read_campaign),
            Input("record", run / "counters.json", "json", read_campaign),
            Input("record", run / "requests.parquet", "parquet", read_campaign),
            Input("record", run / "chunks.parquet", "parquet", read_campaign),
            Input("record", run / "ring.parquet", "parquet", read_campaign),
            Input("record", run / "samples.parquet", "parquet", read_campaign),
            Input("record", frozen / "inputs" / "manifest.json", "json", _read_frozen(frozen)),
        ],
    }


def mutations_for(item: Input) -> st.SearchStrategy[Mutation]:
    """The mutations that make sense for ``item``'s format."""
    if item.fmt == "binary":
        return binary_mutations()
    if item.fmt == "parquet":
        return st.one_of(binary_mutations(), _frame_edits())
    return text_mutations(item.fmt)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Input]]:
    """Every input kind, copied or generated into one folder the examples mutate in place."""
    return _build_inputs(tmp_path_factory.mktemp("bad-input"))


def read_mutated(item: Input, mutation: Mutation) -> BaseException | None:
    """Write ``item`` mutated, read it, restore it; the exception the reader raised, if any."""
    original = item.path.read_bytes()
    try:
        try:
            mutated = mutation.apply(original)
        except Exception:
            return None  # the mutation itself did not apply (a structural edit of no node)
        item.path.write_bytes(mutated)
        item.read(item.path)
    except HarnessError as error:
        assert error.lines() and all(line.strip() for line in error.lines())
        return error
    finally:
        item.path.write_bytes(original)
    return None


def _check(item: Input, mutation: Mutation) -> None:
    # Anything but a HarnessError propagates and fails the example, with its traceback.
    read_mutated(item, mutation)


@st.composite
def _cases(draw: st.DrawFn, kind: str, items: dict[str, list[Input]]) -> tuple[Input, Mutation]:
    item = draw(st.sampled_from(items[kind]))
    return item, draw(mutations_for(item))


# Examples per kind: most are fast; an analysis of a whole campaign takes about a second.
KIND_EXAMPLES = {
    "card": 120,
    "boxes": 40,
    "runtime": 40,
    "pool": 60,
    "rowmap": 60,
    "hotlist": 60,
    "counts": 40,
    "trace": 80,
    "ring": 60,
    "torch": 60,
    "record": 24,
}


@pytest.mark.parametrize("kind", list(KIND_EXAMPLES))
def test_a_mutated_input_raises_only_our_errors(kind: str, inputs: dict[str, list[Input]]) -> None:
    """In-process: each reader lets out nothing but a HarnessError, whatever the bytes."""

    @_settings(KIND_EXAMPLES[kind])
    @given(_cases(kind, inputs))
    def check(case: tuple[Input, Mutation]) -> None:
        _check(*case)

    check()


# ---------------------------------------------------------------------------------------------
# Through the real CLI: exit 2, the file named, no traceback.


def _on_line(pattern: bytes, payload: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    """Apply ``payload`` to the first line matching ``pattern``."""

    def apply(data: bytes) -> bytes:
        lines = data.splitlines(keepends=True)
        index = next(i for i, line in enumerate(lines) if re.search(pattern, line))
        lines[index] = payload(lines[index])
        return b"".join(lines)

    return apply


def _line_of(path: Path, pattern: bytes) -> int:
    lines = path.read_bytes().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if re.search(pattern, line))


def _json_edit(edit: Callable[[Any], None]) -> Callable[[bytes], bytes]:
    def apply(data: bytes) -> bytes:
        document = json.loads(data)
        edit(document)
        return json.dumps(document, indent=2).encode()

    return apply


def _set(key: str, value: Any) -> Callable[[Any], None]:
    return lambda document: document.__setitem__(key, value)


def _first_run_cycle(document: Any) -> None:
    document["runs"][0]["cycle"] = 10**30


@dataclass(frozen=True)
class CliCase:
    """A file of one kind damaged one way, the command that reads it, what stderr must say."""

    name: str
    kind: str
    file: str  # name of the input's file
    mutation: Callable[[bytes], bytes]
    argv: Callable[[Path], list[str]]  # from the inputs' folder
    expect: Callable[[Path], str]


CLI_CASES = [
    CliCase(
        "card with a NUL byte",
        "card",
        "demo.yaml",
        _on_line(rb"^box:", lambda line: line.replace(b"local", b"lo\x00cal")),
        lambda root: ["validate", str(root / "campaigns" / "demo.yaml")],
        lambda root: (
            f"demo.yaml:{_line_of(REPO / 'campaigns/demo.yaml', rb'^box:')}: "
            "character #x0000 is not allowed in YAML"
        ),
    ),
    CliCase(
        "card with a python tag",
        "card",
        "demo.yaml",
        _on_line(
            rb"^runtime:",
            lambda line: line.replace(b"refbox", b"!!python/object/apply:os.system ['true']"),
        ),
        lambda root: ["validate", str(root / "campaigns" / "demo.yaml")],
        lambda root: (
            f"demo.yaml:{_line_of(REPO / 'campaigns/demo.yaml', rb'^runtime:')}: "
            "YAML tag !!python/object/apply:os.system is not allowed"
        ),
    ),
    CliCase(
        "pool that is not UTF-8",
        "pool",
        "mixed.jsonl",
        lambda data: data.replace(b"\n", b"\n\xff", 1),
        lambda root: ["validate", str(root / "campaigns" / "demo.yaml")],
        lambda root: "mixed.jsonl:2: not UTF-8 text (byte 0xff)",
    ),
    CliCase(
        "rowmap that is not UTF-8",
        "rowmap",
        "seed.json",
        lambda data: b"\xc3\x28" + data,
        lambda root: [
            "fit-map",
            "--map",
            str(root / "campaigns" / "maps" / "seed.json"),
            "--top",
            "4",
            "--score",
            str(root / "generated" / "route-trace.jsonl"),
        ],
        lambda root: "seed.json:1: not UTF-8 text (byte 0xc3",
    ),
    CliCase(
        "count dump with a number too large for int64",
        "counts",
        "counts.json",
        lambda data: re.sub(rb"\[(\d+)", rb"[18446744073709551616", data, count=1),
        lambda root: [
            "fit-map",
            str(root / "generated" / "counts.json"),
            "--top",
            "2",
            "-o",
            str(root / "out.json"),
        ],
        lambda root: "counts.json: counts must be non-negative integers below 2^63",
    ),
    CliCase(
        "route trace with a huge expert id",
        "trace",
        "trace.npy",
        lambda data: data[:-8] + (2**40).to_bytes(8, "little"),
        lambda root: [
            "fit-map",
            str(root / "generated" / "trace.npy"),
            "--top",
            "2",
            "-o",
            str(root / "out.json"),
        ],
        lambda root: "is more than any model has",
    ),
    CliCase(
        "ring cut short",
        "ring",
        "ring.bin",
        lambda data: data[: len(data) // 2],
        lambda root: ["ring", "show", str(root / "generated" / "ring.bin")],
        lambda root: "ring.bin: truncated ring",
    ),
    CliCase(
        "run.json with a status of the wrong type",
        "record",
        "run.json",
        _json_edit(_set("status", 5)),
        lambda root: ["analyze", str(root / "demo-shaped")],
        lambda root: "run.json: status: must be a string",
    ),
    CliCase(
        "plan.json with a cycle past any integer type",
        "record",
        "plan.json",
        _json_edit(_first_run_cycle),
        lambda root: ["analyze", str(root / "demo-shaped")],
        lambda root: "plan.json: runs[0].cycle: must be a non-negative integer",
    ),
    CliCase(
        "requests.parquet with flipped bytes",
        "record",
        "requests.parquet",
        lambda data: data[:100] + bytes(b ^ 0x5A for b in data[100:400]) + data[400:],
        lambda root: ["analyze", str(root / "demo-shaped")],
        lambda root: "requests.parquet: unreadable parquet",
    ),
]


def _run_mutated(item: Input, mutation: Callable[[bytes], bytes], argv: list[str]) -> Any:
    original = item.path.read_bytes()
    try:
        item.path.write_bytes(mutation(original))
        return run_cli(*argv)
    finally:
        item.path.write_bytes(original)


def _item(inputs: dict[str, list[Input]], kind: str, file: str) -> Input:
    return next(i for i in inputs[kind] if i.path.name == file)


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.name for c in CLI_CASES])
def test_the_cli_exits_2_naming_the_file_without_a_traceback(
    case: CliCase, inputs: dict[str, list[Input]]
) -> None:
    item = _item(inputs, case.kind, case.file)
    root = _root(inputs)
    done = _run_mutated(item, case.mutation, case.argv(root))
    assert done.code == EXIT_BAD_INPUT, done.stderr
    assert "Traceback" not in done.stderr
    assert case.expect(root) in done.stderr, done.stderr


def _root(inputs: dict[str, list[Input]]) -> Path:
    """The folder every input lives under."""
    return inputs["counts"][0].path.parent.parent


def test_debug_shows_the_traceback(inputs: dict[str, list[Input]]) -> None:
    item = _item(inputs, "ring", "ring.bin")
    done = _run_mutated(item, lambda data: data[:10], ["--debug", "ring", "show", str(item.path)])
    assert done.code == EXIT_BAD_INPUT
    assert "Traceback" in done.stderr and "RingError" in done.stderr


# One verb per kind; any mutation must end in exit 0 (harmless) or 2, never a traceback.
CLI_VERBS: dict[str, Callable[[Path, Path], list[str]]] = {
    "card": lambda root, path: ["validate", str(path)],
    "boxes": lambda root, path: ["validate", str(path)],
    "counts": lambda root, path: ["fit-map", str(path), "--top", "2", "-o", str(root / "o.json")],
    "ring": lambda root, path: ["ring", "show", str(path)],
}


@_settings(6)
@given(st.sampled_from(sorted(CLI_VERBS)), st.data())
def test_mutated_inputs_through_the_cli_exit_0_or_2(
    inputs: dict[str, list[Input]], kind: str, data: st.DataObject
) -> None:
    item = data.draw(st.sampled_from(inputs[kind]))
    mutation = data.draw(mutations_for(item))
    try:
        mutation.apply(item.path.read_bytes())
    except Exception:
        return  # a structural edit that found nothing to edit
    done = _run_mutated(item, mutation.apply, CLI_VERBS[kind](_root(inputs), item.path))
    assert done.code in (0, EXIT_BAD_INPUT), (mutation, done.stderr)
    assert "Traceback" not in done.stderr, (mutation, done.stderr)


# ---------------------------------------------------------------------------------------------
# A campaign directory, each file it holds mutated the ways a copy, a sync or a disk goes wrong:
# deleted, truncated, swapped, symlinked, edited within its schema. ``harness gate`` on it may
# only fail verification (exit 3, naming the file) or raise one of our errors; never pass, never
# a traceback. One small campaign is run once per session (``harness run``, the reference
# runtime, shared with tests/test_campaign_trust.py); each case mutates a working copy in place
# and restores it. The files are the top-level records and the journal, and every file of one
# run (the others are of the same
# kinds); what `gate` writes (analysis/, verdict, report) is covered by the output-fault tests.


@dataclass(frozen=True)
class DirFile:
    """One file of the campaign copy and a file of the same kind to swap it with."""

    relative: str
    swap_with: str


@pytest.fixture(scope="module")
def campaign_copy(finished_campaign: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished campaign's records (run once per session), copied to mutate."""
    from tests.campaign_dirs import copy_campaign

    return copy_campaign(finished_campaign, tmp_path_factory.mktemp("campaign-dir"))


def _dir_files(root: Path) -> list[DirFile]:
    runs = sorted(p.name for p in (root / "runs").iterdir())
    first, second = runs[0], runs[1]
    top = ["card.yaml", "card.path", "plan.json", "journal.jsonl", "boxes/local.json"]
    top += sorted(
        p.relative_to(root).as_posix() for p in (root / "inputs").rglob("*") if p.is_file()
    )
    files = [DirFile(name, "card.yaml" if name != "card.yaml" else "plan.json") for name in top]
    for path in sorted((root / "runs" / first).iterdir()):
        files.append(DirFile(f"runs/{first}/{path.name}", f"runs/{second}/{path.name}"))
    return files


def _edit_within_schema(path: Path) -> None:
    """A plausible edit: one number changed (JSON, parquet, text), the file still well formed."""
    if path.suffix == ".parquet":
        frame = pd.read_parquet(path)
        numeric = [c for c in frame.columns if frame[c].dtype.kind in "if"]
        if frame.empty or not numeric:
            frame = pd.concat([frame, frame.iloc[:0]])
            frame.attrs = {"edited": "yes"}
        else:
            frame.loc[frame.index[0], numeric[-1]] = frame[numeric[-1]].iloc[0] + 1
        frame.to_parquet(path, index=False)
        return
    text = path.read_text(encoding="utf-8")
    if path.name == "journal.jsonl":  # an event's time or id is no record; a sealed digest is
        digest = re.search(r'"files": \{"[^"]+": "', text)
        assert digest is not None
        at = digest.end()
        flipped = "0" if text[at] != "0" else "1"
        path.write_text(text[:at] + flipped + text[at + 1 :], encoding="utf-8")
        return
    digit = re.search(r"\d", text)
    if digit is None:
        path.write_text(text + "\n", encoding="utf-8")
        return
    new = "1" if digit.group() != "1" else "2"
    path.write_text(text[: digit.start()] + new + text[digit.end() :], encoding="utf-8")


def _mutate(root: Path, item: DirFile, how: str) -> None:
    path, other = root / item.relative, root / item.swap_with
    if how == "deleted":
        path.unlink()
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "swapped":
        a, b = path.read_bytes(), other.read_bytes()
        path.write_bytes(b)
        other.write_bytes(a)
    elif how == "symlinked":  # to a byte-for-byte copy: the content is right, the file is not
        twin = root.parent / f"twin-{path.name}"
        shutil.copyfile(path, twin)
        path.unlink()
        path.symlink_to(twin)
    else:
        _edit_within_schema(path)


MUTATIONS = ("deleted", "truncated", "swapped", "symlinked", "edited")


def test_a_mutated_campaign_directory_only_fails_verification(campaign_copy: Path) -> None:
    from harness.cli import main

    root = campaign_copy
    assert main(["analyze", str(root), "--json"], out=io.StringIO()) == 0
    saved = {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    }
    outcomes: list[str] = []
    wrong: list[str] = []
    for item in _dir_files(root):
        for how in MUTATIONS:
            if how == "truncated" and (root / item.relative).stat().st_size == 0:
                continue
            if how == "swapped" and saved[item.relative] == saved[item.swap_with]:
                continue  # two runs' identical records (counters of fresh boots): no change
            _mutate(root, item, how)
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    code = main(["gate", str(root), "--quiet"], out=io.StringIO())
            finally:
                for name in (item.relative, item.swap_with):
                    path = root / name
                    if path.is_symlink():
                        path.unlink()
                    path.write_bytes(saved[name])
            said = err.getvalue()
            case = f"{item.relative} {how}: exit {code}: {said.strip()[:300]}"
            outcomes.append(case)
            verified = code == 3 and said.startswith("campaign directory does not verify: ")
            # A cut journal names what it no longer vouches for (a run's run.json, say).
            named = (
                item.relative.split("/")[-1] in said
                or item.swap_with in said
                or item.relative == "journal.jsonl"
            )
            if not (verified and named) or "Traceback" in said:
                wrong.append(case)
    assert not wrong, "\n".join(wrong)
    assert len(outcomes) >= 80  # 18 files, 5 ways, less no-op swaps and empty truncations
