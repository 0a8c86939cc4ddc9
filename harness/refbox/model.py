"""The reference MoE decoder's maths: seeded random weights, byte tokens, a domain router.

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

The forward pass fetches expert weights through an :class:`ExpertSource`; where they live (hot
arrays or the slow memory-mapped tier, :mod:`harness.refbox.tiers`) never changes the math, only
the cost: both tiers hold the same float32 bytes. Host steps, counters and the route trace
format belong to :mod:`harness.refbox.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]

BOS = 256
VOCAB = 257  # 256 bytes + BOS
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
        experts, x, dom = self._forward(state, token, source, context_weight)
        return StepRouting(experts=experts, logits=self._head(state, token, x, dom))

    def route(
        self, state: DecodeState, token: int, source: ExpertSource, context_weight: float = 1.0
    ) -> I64:
        """:meth:`step` without the output head, for a prompt token whose logits nobody reads
        (every one but the last, as a real runtime's prefill): the same state and experts."""
        return self._forward(state, token, source, context_weight)[0]

    def _forward(
        self, state: DecodeState, token: int, source: ExpertSource, context_weight: float
    ) -> tuple[I64, F32, F32]:
        """The layers: updates ``state``; the experts per layer, the last hidden state and the
        domain weights.

        Vector-matrix products go through ``np.dot``: the same BLAS call as ``@`` (bit for bit,
        pinned by a digest in the tests) at a third of its dispatch cost, which dominates at
        these sizes.
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
        dot = np.dot
        x = self.embed[token] + dot(dom, self.domain_embed)
        top_k = cfg.top_k
        experts = np.empty((cfg.layers, top_k), dtype=np.int64)
        d, f = cfg.d_model, cfg.d_ff
        split = d * f
        for layer in range(cfg.layers):
            ctx = state.ctx[layer]
            ctx *= _CTX_DECAY
            ctx += _CTX_MIX * x
            u = x + dot(ctx, self.ctx_mix[layer])
            u = u * np.float32(1.0 / np.sqrt(float(dot(u, u)) / d + 1e-6))
            logits = dot(dom, self.domain_pref[layer]) + dot(u, self.router_w[layer])
            # By logit, ties by id (a stable sort of the negated logits): deterministic.
            top = np.argsort(-logits, kind="stable")[:top_k]
            experts[layer] = top
            chosen = logits[top]
            gate = np.exp(chosen - chosen.max())
            gate /= gate.sum()
            y = np.zeros(d, dtype=np.float32)
            for j, e in enumerate(top.tolist()):
                row = source.fetch(layer, e)
                hidden = np.maximum(dot(u, row[:split].reshape(d, f)), _ZERO)
                y += gate[j] * dot(hidden, row[split:].reshape(f, d))
            x = x + y
        return experts, x, dom

    def _head(self, state: DecodeState, token: int, x: F32, dom: F32) -> F32:
        """Next-byte logits from the last hidden state."""
        d = self.cfg.d_model
        xn = x * np.float32(1.0 / np.sqrt(float(np.dot(x, x)) / d + 1e-6))
        out = np.dot(xn, self.out_w) + self.token_out[token] + np.dot(dom, self.domain_unigram)
        # A repetition penalty on recent ASCII and continuation bytes keeps greedy text from
        # collapsing into a loop (which would drag the domain histogram off the prompt's domain).
        recent = np.frombuffer(state.recent[-_PENALTY_WINDOW:], dtype=np.uint8)
        recent = recent[recent < 0xC2]
        np.subtract.at(out, recent, np.float32(_REPEAT_PENALTY))
        out[_FORBIDDEN[min(state.pending_continuation, 1)]] = -np.inf
        logits: F32 = out.astype(np.float32)
        return logits


_CTX_DECAY = np.float32(0.9)
_CTX_MIX = np.float32(0.1)
_ZERO = np.float32(0.0)


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
