"""The reference MoE decoder: seeded random weights, byte tokens, a router built around domains.

The math is a small but real mixture-of-experts decoder, numpy float32 throughout:

* tokens are bytes (0..255) plus ``BOS`` (256), prepended to every prompt; generation never
  emits a special token, so a request yields exactly ``max_tokens`` tokens;
* each layer mixes a decayed context of its inputs (an attention stand-in), routes the token to
  ``top_k`` of ``experts`` experts and adds their gated two-matrix FFN outputs;
* the router is *constructed*: a slowly decayed histogram of byte classes and keywords is scored
  against seven domain profiles (English, Japanese, Python, math, Chinese, JSON, agent tool
  calls), and each domain owns a Zipf-ranked expert preference per layer, so a domain shift is a
  real shift in which experts are used. The hidden state adds per-token variation on top;
* the output head mixes the domain's byte unigram with the hidden state, under a UTF-8 mask, so
  greedy continuations keep their prompt's domain character (and stay valid UTF-8).

Where an expert's weights live (hot arrays or the slow memory-mapped tier) never changes the
math, only the cost: both tiers hold the same float32 bytes.

Host steps: a request's prefill (BOS + prompt) is one step and yields the first generated token;
each later token is one decode step, so ``max_tokens`` costs 1 + (max_tokens - 1) steps.

Route trace (JSONL, ``--route-trace``), everything the policy saw, in order:

* ``{"kind": "header", "version": 2, "layers", "experts", "top_k", "hot_slots", "mode":
  "rowmap"|"cache", "knobs": {policy knobs + phase}, "hot": [[ids] per layer]}`` (``hot`` is
  empty in cache mode);
* per host step ``{"kind": "step", "step": n, "prefill": bool, "phase": p, "experts": ...}``:
  a decode step carries ``[[top_k ids] per layer]``, a prefill step one such list per prompt
  token (BOS first): ``[[[...] per layer] per token]``. The engine calls
  ``ResidencyPolicy.observe`` once per host step (a prefill step is not counted);
* after a step line that drained the swap queue, ``{"kind": "drain", "step", "swaps",
  "saturated"}`` (saturated: layers pinned at the budget), then one ``{"kind": "swap", "step",
  "layer", "promoted", "evicted"}`` per swap the policy applied, in the policy's order;
* ``{"kind": "knobs", "step": n, "knobs": {...}}`` when live knobs change; they apply from step
  ``n`` (the next step to run) on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal, Protocol, TextIO

import numpy as np
import numpy.typing as npt

from harness import policy_kernels
from harness.errors import KnobError
from harness.policy import ExpertCache, PolicyKnobs, ResidencyPolicy, Swap
from harness.telemetry import ROUTE_TRACE_VERSION, RingGeometry, RingWriter

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]

BOS = 256
VOCAB = 257  # 256 bytes + BOS
LIVE_KNOBS = (
    "policy",
    "decay_half_life_steps",
    "promote_threshold",
    "hysteresis",
    "drain_every",
    "swaps_per_layer",
    "phase",
)
DOMAINS = ("english", "japanese", "python", "math", "chinese", "json", "agent")

# Built-in samples: they define each domain's byte-class profile and byte unigram, and serve as
# test and benchmark prompts.
DOMAIN_SAMPLES: dict[str, str] = {
    "english": (
        "The old lighthouse keeper walked along the shore every morning, counting the boats "
        "that had come back during the night. He liked the quiet hour before the town woke up, "
        "when the gulls were the only ones arguing and the sea was the colour of slate. Most "
        "days nothing happened, and that was exactly how he wanted it. People in the village "
        "said he was lonely, but he would tell anyone who asked that a man with a good view "
        "and a warm kettle is never really alone. In the winter the storms came in hard from "
        "the west, and he would sit by the window with a book he had read many times before."
    ),
    "japanese": (
        "むかしむかし、ある小さな村に、おじいさんとおばあさんが住んでいました。おじいさんは毎日"
        "山へしばかりに、おばあさんは川へせんたくに行きました。ある日、おばあさんが川で"
        "せんたくをしていると、大きなももが流れてきました。おばあさんはそのももを家に"
        "持って帰りました。これはとてもふしぎなお話です。きょうはいい天気ですね。わたしは"
        "コーヒーをのみながら、ゆっくりと本をよんでいます。"
    ),
    "python": (
        "import os\nfrom dataclasses import dataclass\n\n\n@dataclass\nclass Config:\n"
        "    path: str\n    retries: int = 3\n\n\ndef load_lines(path: str) -> list[str]:\n"
        '    """Read a file and return its stripped lines."""\n'
        "    with open(path, encoding='utf-8') as handle:\n"
        "        return [line.strip() for line in handle if line.strip()]\n\n\n"
        "def main(argv: list[str]) -> int:\n    config = Config(path=argv[1])\n"
        "    for attempt in range(config.retries):\n        try:\n"
        "            lines = load_lines(config.path)\n        except OSError as error:\n"
        "            print(f'attempt {attempt}: {error}')\n            continue\n"
        "        return len(lines)\n    return 0\n\n\nclass Counter:\n"
        "    def __init__(self) -> None:\n        self.total = 0\n\n"
        "    def add(self, value: int) -> None:\n        self.total += value\n"
    ),
    "math": (
        "Let f(x) = 3x^2 - 5x + 2. Then f'(x) = 6x - 5, so f'(x) = 0 at x = 5/6. "
        "Compute 17 * 23 = 391 and 391 / 17 = 23. Solve 2x + 7 = 19: 2x = 12, x = 6. "
        "The sum 1 + 2 + ... + 100 = 100 * 101 / 2 = 5050. If a^2 + b^2 = c^2 with a = 3 and "
        "b = 4, then c = sqrt(9 + 16) = sqrt(25) = 5. \\frac{1}{2} + \\frac{1}{3} = "
        "\\frac{5}{6}. (x + 1)(x - 1) = x^2 - 1. 12 % 5 = 2, 2^10 = 1024, 0.25 * 48 = 12. "
        "Integral of 2x dx from 0 to 3 = 9. 7 * 8 = 56, 56 - 14 = 42, 42 / 6 = 7."
    ),
    "chinese": (
        "在很久以前，有一个小村庄，村里住着一位老人。他每天早上都会去河边散步，看着河水"
        "慢慢地流向远方。村里的人都说他很孤独，但是他自己觉得生活很平静。春天的时候，"
        "山上开满了花，空气中有淡淡的香味。我们应该学习他的态度，珍惜每一天的时光。"
        "中国的历史非常悠久，文化也很丰富。今天天气很好，我们一起去公园吧。"
    ),
    "json": (
        '{"id": 4812, "name": "sensor-17", "active": true, "readings": [12.5, 13.0, 12.75, '
        '14.25], "location": {"lat": 35.6895, "lon": 139.6917}, "tags": ["north", "roof"], '
        '"updated": "2025-10-24T20:00:00Z", "battery": 0.82, "errors": null}\n'
        '{"id": 4813, "name": "sensor-18", "active": false, "readings": [9.0, 9.5], '
        '"location": {"lat": 35.7, "lon": 139.7}, "tags": [], "updated": '
        '"2025-10-24T20:05:00Z", "battery": 0.15, "errors": [{"code": 17, "count": 3}]}\n'
    ),
    "agent": (
        '<tool_call>{"tool": "search_web", "arguments": {"query": "weather in paris '
        'tomorrow", "max_results": 5}}</tool_call>\n<tool_result>{"results": [{"title": '
        '"Paris forecast", "snippet": "light rain, mild"}]}</tool_result>\nI looked up the '
        'forecast for you.\n<tool_call>{"tool": "read_file", "arguments": {"path": '
        '"notes/todo.md"}}</tool_call>\n<tool_call>{"tool": "run_shell", "arguments": '
        '{"command": "ls -la src", "timeout_s": 30}}</tool_call>\n<tool_call>{"tool": '
        '"send_email", "arguments": {"to": "team", "subject": "status update"}}</tool_call>\n'
    ),
}

# Multi-byte cues the byte classes alone cannot see; each is one extra feature that fires when
# the recent bytes end with it.
KEYWORDS = (
    b"def ",
    b"return",
    b"import",
    b"self",
    b"tool",
    b"argument",
    b"_call",
    b"\\frac",
    b'{"',
    b'": ',
    b" the ",
    b" and ",
    b"sqrt",
    b"    ",
)
N_BYTE_CLASSES = 24
N_FEATURES = N_BYTE_CLASSES + len(KEYWORDS)
_KEYWORD_WEIGHT = 3.0  # keywords are rare; weigh them so they matter in the histogram
_MAX_KEYWORD = max(len(k) for k in KEYWORDS)


def _build_byte_class() -> npt.NDArray[np.int8]:
    """Map every byte to one of the 24 classes (space vs indentation is decided in context)."""
    table = np.full(256, 23, dtype=np.int8)  # other: control bytes, invalid leads
    for b in range(256):
        c = chr(b)
        if b < 128:
            if c.islower():
                table[b] = 0
            elif c.isupper():
                table[b] = 1
            elif c.isdigit():
                table[b] = 2
            elif c == " ":
                table[b] = 3
            elif c == "\n":
                table[b] = 5
            elif c in "+-*/=^<>%":
                table[b] = 6
            elif c in "()":
                table[b] = 7
            elif c in "[]":
                table[b] = 8
            elif c in "{}":
                table[b] = 9
            elif c == '"':
                table[b] = 10
            elif c in "'`":
                table[b] = 11
            elif c == ":":
                table[b] = 12
            elif c == ",":
                table[b] = 13
            elif c == ".":
                table[b] = 14
            elif c in "!?;":
                table[b] = 15
            elif c == "_":
                table[b] = 16
            elif c in "\\$":
                table[b] = 17
            elif c in "#@&|~":
                table[b] = 18
        elif b == 0xE3:
            table[b] = 19
        elif 0xE4 <= b <= 0xE9:
            table[b] = 20
        elif 0xC2 <= b <= 0xF4:
            table[b] = 21
        elif 0x80 <= b <= 0xBF:
            table[b] = 22
    return table


BYTE_CLASS = _build_byte_class()


def byte_features(prev: bytes, byte: int) -> list[tuple[int, float]]:
    """The features one byte adds to the domain context: its class, and any keyword it ends.

    ``prev`` holds the bytes before this one (only the last few matter). A space that follows a
    newline or another leading space is indentation (class 4), not a word gap (class 3).
    """
    cls = int(BYTE_CLASS[byte])
    if cls == 3 and prev and prev[-1:] in (b"\n", b" ") and _in_indent(prev):
        cls = 4
    feats = [(cls, 1.0)]
    tail = prev[-(_MAX_KEYWORD - 1) :] + bytes((byte,))
    for i, kw in enumerate(KEYWORDS):
        if tail.endswith(kw):
            feats.append((N_BYTE_CLASSES + i, _KEYWORD_WEIGHT))
    return feats


def _in_indent(prev: bytes) -> bool:
    """True when ``prev`` ends in a newline followed only by spaces."""
    stripped = prev.rstrip(b" ")
    return stripped.endswith(b"\n") or not stripped


def text_features(data: bytes) -> F32:
    """The summed feature histogram of a whole text (used to build the domain profiles)."""
    hist = np.zeros(N_FEATURES, dtype=np.float64)
    for i, b in enumerate(data):
        for f, w in byte_features(data[max(0, i - 16) : i], b):
            hist[f] += w
    return hist.astype(np.float32)


@dataclass(frozen=True)
class ModelConfig:
    """Geometry and seed of the decoder; the weights are a pure function of this."""

    layers: int = 8
    experts: int = 64
    top_k: int = 4
    d_model: int = 64
    d_ff: int = 128
    seed: int = 0
    # Router shape: domain preference gain, Zipf exponent of the per-domain ranking, and the
    # scale of the hidden-state term that spreads a domain's tokens over its experts.
    router_zipf: float = 1.2
    router_noise: float = 2.0
    domain_sharpness: float = 12.0
    context_decay: float = 0.985
    bigram_scale: float = 1.0

    @property
    def expert_floats(self) -> int:
        """Floats in one expert's weights (W1: d×f, then W2: f×d)."""
        return 2 * self.d_model * self.d_ff

    @property
    def expert_weight_bytes(self) -> int:
        """Bytes of one expert's weights, before any slow-tier padding."""
        return 4 * self.expert_floats


def expert_weights(cfg: ModelConfig, layer: int) -> F32:
    """All experts of one layer as rows of ``expert_floats`` float32 (seeded per layer)."""
    rng = np.random.default_rng([cfg.seed, 1, layer])
    w1 = rng.standard_normal((cfg.experts, cfg.d_model, cfg.d_ff), dtype=np.float32)
    w1 *= np.float32(1.0 / np.sqrt(cfg.d_model))
    w2 = rng.standard_normal((cfg.experts, cfg.d_ff, cfg.d_model), dtype=np.float32)
    w2 *= np.float32(0.5 / np.sqrt(cfg.d_ff))
    return np.concatenate(
        [w1.reshape(cfg.experts, -1), w2.reshape(cfg.experts, -1)], axis=1
    ).astype(np.float32)


@dataclass
class DecodeState:
    """Per-request recurrent state: layer contexts, the domain histogram and recent bytes."""

    ctx: F32
    domain_hist: F32
    recent: bytes = b""
    pending_continuation: int = 0  # UTF-8 continuation bytes still owed by the last lead byte

    @classmethod
    def fresh(cls, cfg: ModelConfig) -> DecodeState:
        """An empty state for a new request."""
        return cls(
            ctx=np.zeros((cfg.layers, cfg.d_model), dtype=np.float32),
            domain_hist=np.zeros(N_FEATURES, dtype=np.float32),
        )


@dataclass
class StepRouting:
    """What one token did: the experts chosen per layer, and the next-token logits."""

    experts: I64  # [layers, top_k]
    logits: F32  # [256]


class ExpertSource(Protocol):
    """Where the forward pass fetches expert weights; tiers implement it and count the cost."""

    def fetch(self, layer: int, expert: int) -> F32:
        """The ``expert_floats`` weights of one expert (same values whichever tier serves it)."""
        ...


@dataclass
class Model:
    """The decoder's dense weights and its router construction (experts live in a source)."""

    cfg: ModelConfig
    embed: F32 = field(init=False)
    domain_embed: F32 = field(init=False)
    ctx_mix: F32 = field(init=False)
    router_w: F32 = field(init=False)
    domain_pref: F32 = field(init=False)
    out_w: F32 = field(init=False)
    domain_logp: F32 = field(init=False)
    domain_unigram: F32 = field(init=False)
    token_out: F32 = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, 0])
        d, n_dom = cfg.d_model, len(DOMAINS)
        self.embed = rng.standard_normal((VOCAB, d), dtype=np.float32)
        self.domain_embed = rng.standard_normal((n_dom, d), dtype=np.float32)
        self.ctx_mix = rng.standard_normal((cfg.layers, d, d), dtype=np.float32) * np.float32(
            0.5 / np.sqrt(d)
        )
        self.router_w = rng.standard_normal((cfg.layers, d, cfg.experts), dtype=np.float32)
        self.router_w *= np.float32(cfg.router_noise / np.sqrt(d))
        # Each domain ranks the experts of each layer by its own permutation, Zipf-like.
        ranks = np.log1p(np.arange(cfg.experts, dtype=np.float32))
        pref = np.empty((cfg.layers, n_dom, cfg.experts), dtype=np.float32)
        for layer in range(cfg.layers):
            for dom in range(n_dom):
                perm = rng.permutation(cfg.experts)
                pref[layer, dom, perm] = -cfg.router_zipf * ranks
        self.domain_pref = pref
        self.out_w = rng.standard_normal((d, 256), dtype=np.float32) * np.float32(1.2 / np.sqrt(d))
        # A random bigram term: the next byte depends on the current one, as in real text.
        self.token_out = rng.standard_normal((VOCAB, 256), dtype=np.float32) * np.float32(
            cfg.bigram_scale
        )
        feats = np.stack([text_features(DOMAIN_SAMPLES[n].encode()) for n in DOMAINS])
        feats += 0.5  # smoothing: an unseen class is unlikely, not impossible
        self.domain_logp = np.log(feats / feats.sum(axis=1, keepdims=True)).astype(np.float32)
        uni = np.full((n_dom, 256), 0.02, dtype=np.float64)
        for i, name in enumerate(DOMAINS):
            counts = np.bincount(np.frombuffer(DOMAIN_SAMPLES[name].encode(), np.uint8), None, 256)
            uni[i] += counts
        self.domain_unigram = np.log(uni / uni.sum(axis=1, keepdims=True)).astype(np.float32)

    def domain_weights(self, hist: F32) -> F32:
        """Soft domain assignment of a feature histogram (a softmax over profile likelihoods)."""
        total = float(hist.sum())
        if total <= 0.0:
            return np.full(len(DOMAINS), 1.0 / len(DOMAINS), dtype=np.float32)
        ll = self.domain_logp @ (hist / np.float32(total))
        z = np.float32(self.cfg.domain_sharpness) * (ll - ll.max())
        weights: F32 = np.exp(z).astype(np.float32)
        weights /= weights.sum()
        return weights

    def step(
        self, state: DecodeState, token: int, source: ExpertSource, context_weight: float = 1.0
    ) -> StepRouting:
        """Run one token through every layer; updates ``state`` and returns routing and logits.

        ``context_weight`` is how strongly the token moves the domain context (1 for prompt
        tokens; the engine feeds generated tokens at ``GENERATED_CONTEXT_WEIGHT``, so a long
        generation keeps routing like its prompt's domain instead of drifting with its output).
        """
        cfg = self.cfg
        if token < 256:
            hist = state.domain_hist
            hist *= np.float32(cfg.context_decay**context_weight)
            for f, w in byte_features(state.recent, token):
                hist[f] += np.float32(w * context_weight)
            state.recent = (state.recent + bytes((token,)))[-16:]
            state.pending_continuation = _next_pending(state.pending_continuation, token)
        dom = self.domain_weights(state.domain_hist)
        x = self.embed[token] + dom @ self.domain_embed
        experts = np.empty((cfg.layers, cfg.top_k), dtype=np.int64)
        d, f = cfg.d_model, cfg.d_ff
        decay = np.float32(0.9)
        for layer in range(cfg.layers):
            ctx = state.ctx[layer]
            ctx *= decay
            ctx += np.float32(0.1) * x
            u = x + ctx @ self.ctx_mix[layer]
            u = u * np.float32(1.0 / np.sqrt(float(u @ u) / d + 1e-6))
            logits = dom @ self.domain_pref[layer] + u @ self.router_w[layer]
            top = np.argpartition(-logits, cfg.top_k - 1)[: cfg.top_k]
            top = top[np.lexsort((top, -logits[top]))]  # by logit, ties by id: deterministic
            experts[layer] = top
            gate = np.exp(logits[top] - logits[top].max())
            gate /= gate.sum()
            y = np.zeros(d, dtype=np.float32)
            for j, e in enumerate(top):
                row = source.fetch(layer, int(e))
                hidden = np.maximum(u @ row[: d * f].reshape(d, f), np.float32(0.0))
                y += gate[j] * (hidden @ row[d * f :].reshape(f, d))
            x = x + y
        xn = x * np.float32(1.0 / np.sqrt(float(x @ x) / d + 1e-6))
        out = xn @ self.out_w + self.token_out[token] + dom @ self.domain_unigram
        # A repetition penalty on recent ASCII and continuation bytes keeps greedy text from
        # collapsing into a loop (which would drag the domain histogram off the prompt's domain).
        recent = np.frombuffer(state.recent[-_PENALTY_WINDOW:], dtype=np.uint8)
        recent = recent[recent < 0xC2]
        np.subtract.at(out, recent, np.float32(_REPEAT_PENALTY))
        out[_FORBIDDEN[min(state.pending_continuation, 1)]] = -np.inf
        return StepRouting(experts=experts, logits=out.astype(np.float32))


def _next_pending(pending: int, byte: int) -> int:
    """UTF-8 bookkeeping: continuation bytes still owed after ``byte``."""
    if 0x80 <= byte <= 0xBF:
        return max(pending - 1, 0)
    if 0xC2 <= byte <= 0xDF:
        return 1
    if 0xE0 <= byte <= 0xEF:
        return 2
    if 0xF0 <= byte <= 0xF4:
        return 3
    return 0


def _forbidden_masks() -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Bytes the head may not emit: [0] at a character start, [1] inside a multi-byte char."""
    at_start = np.zeros(256, dtype=bool)
    at_start[0x80:0xC2] = True  # continuation bytes and overlong leads
    at_start[[0xE0, 0xED]] = True  # leads whose second byte is restricted: never start them
    at_start[0xF0:] = True  # no 4-byte characters
    at_start[:0x20] = True
    at_start[[0x09, 0x0A]] = False  # tab and newline are fine
    at_start[0x7F] = True
    inside = np.ones(256, dtype=bool)
    inside[0x80:0xC0] = False
    return at_start, inside


_FORBIDDEN = _forbidden_masks()
GENERATED_CONTEXT_WEIGHT = 0.25
_PENALTY_WINDOW = 12
_REPEAT_PENALTY = 1.5


def pick_token(logits: F32, temperature: float, rng: np.random.Generator | None) -> int:
    """Greedy argmax at temperature 0 (lowest id wins ties), else a seeded softmax sample."""
    if temperature <= 0.0 or rng is None:
        return int(np.argmax(logits))
    z = (logits - logits.max()) / np.float32(temperature)
    p = np.exp(z.astype(np.float64))
    p /= p.sum()
    return int(rng.choice(256, p=p))


def routing_shares(experts: Sequence[I64], cfg: ModelConfig) -> npt.NDArray[np.float64]:
    """Per layer and expert, the share of routes (rows sum to 1) over many tokens' routings."""
    counts = np.zeros((cfg.layers, cfg.experts), dtype=np.float64)
    for step in experts:
        for layer in range(cfg.layers):
            counts[layer, step[layer]] += 1.0
    shares: npt.NDArray[np.float64] = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    return shares


class SlowTier:
    """Every expert's record in one memory-mapped file; each read copies a whole record.

    A record is the expert's float32 weights padded to ``record_bytes``, so the cost of a cold
    lookup (a real page-cache read and copy, never a sleep) scales with ``--expert-bytes``.
    With ``--cold-dir`` the file is kept there, named by everything that determines its bytes,
    and reused by later boots: like a real model file it can then be evicted from the page cache
    for a ``cold`` run. Without it the file is a temporary, unlinked as soon as it is mapped.
    """

    def __init__(self, cfg: ModelConfig, record_bytes: int, directory: str | None) -> None:
        """Map the slow-tier file under ``directory``, writing it first when it is missing."""
        self.cfg = cfg
        self.record_bytes = max(record_bytes, cfg.expert_weight_bytes)
        self._weight_bytes = cfg.expert_weight_bytes
        if directory is None:
            fd, path = tempfile.mkstemp(prefix="refbox-cold-", suffix=".bin")
            try:
                with open(fd, "wb") as handle:
                    self._fill(handle)
                self._map = np.memmap(path, dtype=np.uint8, mode="r+")
            finally:
                os.unlink(path)
            return
        path = os.path.join(directory, self.file_name())
        size = cfg.layers * cfg.experts * self.record_bytes
        if not (os.path.isfile(path) and os.path.getsize(path) == size):
            fd, tmp = tempfile.mkstemp(prefix=".refbox-slow-", suffix=".tmp", dir=directory)
            with open(fd, "wb") as handle:
                self._fill(handle)
                # Written back now, at boot: left dirty, a large file is flushed during the
                # next runs and slows them, which a campaign would read as drift.
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)  # atomic: a concurrent boot never maps half a file
        self._map = np.memmap(path, dtype=np.uint8, mode="r+")

    def file_name(self) -> str:
        """Name of the persistent file: a digest of everything that determines its bytes."""
        key = f"{dataclasses.astuple(self.cfg)!r}-{self.record_bytes}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return f"refbox-slow-{digest}.bin"

    def _fill(self, handle: BinaryIO) -> None:
        pad = bytes(self.record_bytes - self._weight_bytes)
        for layer in range(self.cfg.layers):
            weights = expert_weights(self.cfg, layer)
            for e in range(self.cfg.experts):
                handle.write(weights[e].tobytes())
                handle.write(pad)

    def offset(self, layer: int, expert: int) -> int:
        """Byte offset of one expert's record."""
        return (layer * self.cfg.experts + expert) * self.record_bytes

    def read(self, layer: int, expert: int) -> F32:
        """Copy one whole record out of the file and return its weights (a fresh array)."""
        start = self.offset(layer, expert)
        record = np.array(self._map[start : start + self.record_bytes])
        return record[: self._weight_bytes].view(np.float32)

    def write(self, layer: int, expert: int, weights: F32) -> None:
        """Copy weights back into an expert's record (the eviction half of a swap)."""
        start = self.offset(layer, expert)
        self._map[start : start + self._weight_bytes] = weights.view(np.uint8)


@dataclass
class TierCounters:
    """Cost counters of the tiers, cumulative over the process."""

    lookups: int = 0
    cold_lookups: int = 0
    bytes_read: int = 0
    expert_loads: int = 0


class RowmapTiers(ExpertSource):
    """Per layer, ``hot_slots`` experts in resident arrays; the rest read from the slow tier."""

    def __init__(self, slow: SlowTier, hot: Sequence[Sequence[int]]) -> None:
        """Fill the hot arrays from the slow tier, one slot per hot expert of each layer."""
        cfg = slow.cfg
        self.slow = slow
        self.counters = TierCounters()
        self.hot_slots = len(hot[0]) if hot else 0
        self.rows = np.zeros((cfg.layers, self.hot_slots, cfg.expert_floats), dtype=np.float32)
        self.slot_of = np.full((cfg.layers, cfg.experts), -1, dtype=np.int64)
        for layer, experts in enumerate(hot):
            for slot, e in enumerate(experts):
                self.rows[layer, slot] = slow.read(layer, e)
                self.slot_of[layer, e] = slot

    def fetch(self, layer: int, expert: int) -> F32:
        """Hot: a view of the resident row. Cold: a real read and copy from the slow tier."""
        self.counters.lookups += 1
        slot = int(self.slot_of[layer, expert])
        if slot >= 0:
            hot_row: F32 = self.rows[layer, slot]
            return hot_row
        self.counters.cold_lookups += 1
        self.counters.bytes_read += self.slow.record_bytes
        self.counters.expert_loads += 1
        return self.slow.read(layer, expert)

    def swap(self, layer: int, promoted: int, evicted: int) -> None:
        """Move ``evicted`` out to the slow tier and ``promoted`` into its slot, copying both."""
        slot = int(self.slot_of[layer, evicted])
        if slot < 0 or self.slot_of[layer, promoted] >= 0:
            raise ValueError(f"bad swap at layer {layer}: promote {promoted}, evict {evicted}")
        self.slow.write(layer, evicted, self.rows[layer, slot])
        self.rows[layer, slot] = self.slow.read(layer, promoted)
        self.counters.bytes_read += self.slow.record_bytes
        self.counters.expert_loads += 1
        self.slot_of[layer, evicted] = -1
        self.slot_of[layer, promoted] = slot

    def hot_sets(self) -> list[list[int]]:
        """The hot experts of each layer, sorted."""
        return [sorted(np.flatnonzero(row >= 0).tolist()) for row in self.slot_of]


_PRUNE_SLACK = 64


class CacheTiers(ExpertSource):
    """Cache mode (seed 004): an ExpertCache decides hits; a miss reads the slow tier.

    Resident weights are kept for exactly the (layer, expert) pairs the cache holds, so a hit is
    served from memory and a miss costs a real slow-tier read.
    """

    def __init__(self, slow: SlowTier, cache: ExpertCache) -> None:
        """Preload the cache's initial residents (the hotlist prefix) into memory."""
        self.slow = slow
        self.cache = cache
        self.counters = TierCounters()
        self.resident: dict[tuple[int, int], F32] = {}
        for key in cache.resident():
            self.resident[key] = slow.read(*key)

    def fetch(self, layer: int, expert: int) -> F32:
        """Ask the cache; serve a hit from memory, a miss from the slow tier (then keep it)."""
        self.counters.lookups += 1
        key = (layer, expert)
        hit = self.cache.access(layer, expert)
        weights = self.resident.get(key) if hit else None
        if weights is not None:
            return weights
        self.counters.cold_lookups += 1
        self.counters.bytes_read += self.slow.record_bytes
        self.counters.expert_loads += 1
        weights = self.slow.read(layer, expert)
        self.resident[key] = weights  # a miss always loads the record into the cache
        # The cache does not say which record it evicted; prune in batches so the scan is rare.
        if len(self.resident) > self.cache.capacity + _PRUNE_SLACK:
            for stale in [k for k in self.resident if self.cache.priority_of(*k) is None]:
                del self.resident[stale]
        return weights


@dataclass(frozen=True)
class EngineOptions:
    """Everything about a runtime instance except the model geometry."""

    hot_slots: int = 48
    expert_bytes: int = 512 * 1024
    cold_dir: str | None = None
    rowmap: list[list[int]] | None = None  # hot experts per layer; None = first hot_slots
    knobs: PolicyKnobs | None = None  # None = adaptation frozen with default knobs
    cache_records: int = 0  # > 0 selects cache mode
    hotlist: list[tuple[int, int]] = field(default_factory=list)
    hotlist_priority: Literal["legacy", "adaptive"] | int = "adaptive"
    ring_path: str | None = None
    ring_capacity: int = 65536
    route_trace_path: str | None = None
    drift_pct_per_min: float = 0.0
    drift_origin_s: float = 0.0
    phase: int = 0


COUNTER_NAMES = (
    "tokens",
    "steps",
    "lookups",
    "cold_lookups",
    "hits",
    "misses",
    "expert_loads",
    "bytes_read",
    "swaps",
    "evictions",
    "prefill_tokens",
    "decode_tokens",
    "generated_tokens",
    "requests",
)


class Engine:
    """A model plus its tiers, residency policy, counters, ring and route trace.

    Host steps: a request's prefill (BOS + prompt) is one step and yields the first generated
    token; every later generated token costs one decode step. Step numbers count host steps
    over the life of the engine, from 0. All methods are thread-safe: a step holds ``lock``,
    so admin calls (knobs, dumps, counters) land between steps.
    """

    def __init__(self, cfg: ModelConfig, opts: EngineOptions) -> None:
        """Build the weights, write the slow tier, fill the hot tier, open ring and trace."""
        self.cfg = cfg
        self.opts = opts
        self.model = Model(cfg)
        self.lock = threading.Lock()
        self.slow = SlowTier(cfg, opts.expert_bytes, opts.cold_dir)
        self.knobs = opts.knobs or PolicyKnobs(policy="frozen")
        self.phase = opts.phase
        self.step_no = 0
        self.closed = False
        self.requests = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.generated_tokens = 0
        self.swaps = 0
        self.route_counts = np.zeros((cfg.layers, cfg.experts), dtype=np.int64)
        self.policy: ResidencyPolicy | None = None
        self.cache: ExpertCache | None = None
        self.source: RowmapTiers | CacheTiers
        if opts.cache_records > 0:
            self.cache = ExpertCache(
                opts.cache_records, opts.hotlist, opts.hotlist_priority, cfg.layers, cfg.experts
            )
            self.source = CacheTiers(self.slow, self.cache)
            hot_slots = opts.cache_records
        else:
            hot = opts.rowmap or [list(range(opts.hot_slots))] * cfg.layers
            self.source = RowmapTiers(self.slow, hot)
            self.policy = ResidencyPolicy(self.knobs, hot, cfg.experts)
            hot_slots = opts.hot_slots
            # Compile (or load) the policy's drain now, not inside the first timed request.
            policy_kernels.warm_up()
        self.ring: RingWriter | None = None
        if opts.ring_path:
            geometry = RingGeometry(cfg.layers, cfg.experts, cfg.top_k, hot_slots)
            self.ring = RingWriter(opts.ring_path, opts.ring_capacity, geometry)
        self._trace: TextIO | None = None
        if opts.route_trace_path:
            self._trace = open(opts.route_trace_path, "w", encoding="utf-8")  # noqa: SIM115
            self._trace_line(
                {
                    "kind": "header",
                    "version": ROUTE_TRACE_VERSION,
                    "layers": cfg.layers,
                    "experts": cfg.experts,
                    "top_k": cfg.top_k,
                    "hot_slots": hot_slots,
                    "mode": "cache" if self.cache else "rowmap",
                    "knobs": self.knob_dict(),
                    "hot": self.source.hot_sets() if isinstance(self.source, RowmapTiers) else [],
                }
            )
        self._burn = np.ones((32, 32), dtype=np.float32)

    # -- knobs and counters -------------------------------------------------------------------

    def knob_dict(self) -> dict[str, Any]:
        """The live policy knobs plus the phase tag, as JSON-ready values."""
        knobs = dataclasses.asdict(self.knobs)
        knobs["phase"] = self.phase
        return knobs

    def set_knobs(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply live knob changes (validated first, all or nothing); returns the new knobs."""
        unknown = sorted(set(changes) - set(LIVE_KNOBS))
        if unknown:
            raise KnobError(f"unknown knob(s) {unknown}; live knobs are {list(LIVE_KNOBS)}")
        phase = changes.get("phase", self.phase)
        if isinstance(phase, bool) or not isinstance(phase, int):
            raise KnobError(f"phase: must be an integer, got {phase!r}")
        fields = {k: v for k, v in changes.items() if k != "phase"}
        try:
            knobs = dataclasses.replace(self.knobs, **fields)
        except TypeError as exc:
            raise KnobError(str(exc)) from exc
        knobs.validate()
        with self.lock:
            self.knobs = knobs
            self.phase = phase
            if self.policy is not None:
                self.policy.set_knobs(knobs)
            self._trace_line({"kind": "knobs", "step": self.step_no, "knobs": self.knob_dict()})
            return self.knob_dict()

    def counters(self) -> dict[str, int]:
        """Cumulative counters (see COUNTER_NAMES); hits/misses are hot/cold lookups."""
        with self.lock:
            tiers = self.source.counters
            cache = self.cache
            return {
                "tokens": self.prefill_tokens + self.decode_tokens,
                "steps": self.step_no,
                "lookups": tiers.lookups,
                "cold_lookups": tiers.cold_lookups,
                "hits": cache.hits if cache else tiers.lookups - tiers.cold_lookups,
                "misses": cache.misses if cache else tiers.cold_lookups,
                "expert_loads": tiers.expert_loads,
                "bytes_read": tiers.bytes_read,
                "swaps": self.swaps,
                "evictions": cache.evictions if cache else self.swaps,
                "prefill_tokens": self.prefill_tokens,
                "decode_tokens": self.decode_tokens,
                "generated_tokens": self.generated_tokens,
                "requests": self.requests,
            }

    def route_count_dump(self, *, cumulative: bool = False) -> npt.NDArray[np.float64]:
        """Counts per layer and expert for map fitting: the policy's decayed counts (rowmap
        mode, by default), else the raw cumulative decode route counts."""
        with self.lock:
            if self.policy is not None and not cumulative:
                return np.asarray(self.policy.counts(), dtype=np.float64)
            return self.route_counts.astype(np.float64)

    def hot_sets(self) -> list[list[int]]:
        """Current hot experts per layer (rowmap mode; empty in cache mode)."""
        with self.lock:
            if isinstance(self.source, RowmapTiers):
                return self.source.hot_sets()
            return []

    # -- generation ---------------------------------------------------------------------------

    def generate(
        self, prompt: bytes, max_tokens: int, temperature: float = 0.0, seed: int = 0
    ) -> Iterator[int]:
        """Yield exactly ``max_tokens`` generated bytes for ``prompt`` (no stop condition)."""
        state = DecodeState.fresh(self.cfg)
        rng = np.random.default_rng(seed) if temperature > 0.0 else None
        with self.lock:
            self.requests += 1
        if max_tokens <= 0:
            return
        logits = self._step([BOS, *prompt], state, prefill=True)
        for i in range(max_tokens):
            token = pick_token(logits, temperature, rng)
            with self.lock:
                self.generated_tokens += 1
            yield token
            if i + 1 < max_tokens:
                if self.closed:  # shutting down: stop generating rather than finish the request
                    return
                logits = self._step([token], state, prefill=False)

    def _step(self, tokens: list[int], state: DecodeState, *, prefill: bool) -> F32:
        """One host step over ``tokens``: forward, policy, swaps, drift, ring and trace."""
        with self.lock:
            tiers = self.source.counters
            lookups0, cold0, bytes0 = tiers.lookups, tiers.cold_lookups, tiers.bytes_read
            t0 = time.perf_counter_ns()
            step = self.step_no
            routes: list[I64] = []
            applied: list[Swap] = []
            logits: F32 | None = None
            weight = 1.0 if prefill else GENERATED_CONTEXT_WEIGHT
            for token in tokens:
                out = self.model.step(state, token, self.source, weight)
                routes.append(out.experts)
                logits = out.logits
                if not prefill:
                    for layer in range(self.cfg.layers):
                        self.route_counts[layer, out.experts[layer]] += 1
            drained = False
            if self.policy is not None:
                # One policy call per host step: a prefill step is not counted, a decode step
                # (one token here) is, and may drain.
                drained = not prefill and self.policy.drain_due()
                applied = self.policy.observe(step, np.stack(routes), prefill=prefill)
                for swap in applied:
                    assert isinstance(self.source, RowmapTiers)
                    self.source.swap(swap.layer, swap.promoted, swap.evicted)
            self._drift(time.perf_counter_ns() - t0)
            t1 = time.perf_counter_ns()
            self.swaps += len(applied)
            if prefill:
                self.prefill_tokens += len(tokens)
            else:
                self.decode_tokens += len(tokens)
            self.step_no += 1
            if self.ring is not None:
                self.ring.append(
                    (
                        t1,
                        t1 - t0,
                        len(tokens),
                        tiers.lookups - lookups0,
                        tiers.cold_lookups - cold0,
                        len(applied),
                        tiers.bytes_read - bytes0,
                        self.phase,
                    )
                )
            if self._trace is not None:
                experts_json: Any = [r.tolist() for r in routes] if prefill else routes[0].tolist()
                self._trace_line(
                    {
                        "kind": "step",
                        "step": step,
                        "prefill": prefill,
                        "phase": self.phase,
                        "experts": experts_json,
                    }
                )
                if drained:
                    assert self.policy is not None
                    self._trace_line(
                        {
                            "kind": "drain",
                            "step": step,
                            "swaps": len(applied),
                            "saturated": self.policy.saturated_layers(),
                        }
                    )
                for swap in applied:
                    self._trace_line(
                        {
                            "kind": "swap",
                            "step": swap.step,
                            "layer": swap.layer,
                            "promoted": swap.promoted,
                            "evicted": swap.evicted,
                        }
                    )
            assert logits is not None
            return logits

    def _drift(self, work_ns: int) -> None:
        """Injected drift: extra real work proportional to the step, growing with time."""
        pct = self.opts.drift_pct_per_min
        if pct <= 0.0:
            return
        minutes = max(0.0, time.time() - self.opts.drift_origin_s) / 60.0
        extra_s = work_ns * 1e-9 * pct / 100.0 * minutes
        deadline = time.perf_counter() + extra_s
        burn = self._burn
        while time.perf_counter() < deadline:
            burn = np.tanh(burn @ self._burn * np.float32(0.01))

    def _trace_line(self, record: dict[str, Any]) -> None:
        if self._trace is not None:
            self._trace.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        """Push the trace and ring to disk (between requests and at shutdown)."""
        with self.lock:
            if self._trace is not None:
                self._trace.flush()
            if self.ring is not None:
                self.ring.flush()

    def close(self) -> None:
        """Flush and close the ring and the trace; closing twice is harmless."""
        with self.lock:
            self.closed = True
            if self._trace is not None:
                self._trace.close()
                self._trace = None
            if self.ring is not None:
                self.ring.close()
                self.ring = None
