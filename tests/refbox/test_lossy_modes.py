"""The reference runtime's lossy modes do what their construction says (harness.refbox.lossy).

The bench of issue 55 checks the equivalence endpoint against what these modes put it at, so
the modes are checked here against an independent computation: scipy's relative entropy over
whole distributions, and the flips' rate against a binomial band. So is the fault only a
canary's log-probabilities can catch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import rel_entr, softmax

from harness.analyze.equivalence import position_kl
from harness.benchmarks.faults import FIRST_SEED
from harness.card.schema import Canaries
from harness.drive.canaries import CANARY_PROMPTS
from harness.refbox.engine import Engine, EngineOptions
from harness.refbox.logprobs import chosen_logprob, top_logprobs
from harness.refbox.lossy import LossyMode, flip_agreement, mixed_kl
from harness.refbox.model import ModelConfig


def _logits(rng: np.random.Generator, scale: float) -> np.ndarray:
    return (rng.standard_normal(256) * scale).astype(np.float32)


@pytest.mark.parametrize("mass", [0.0005, 0.3])
def test_runner_up_mass_has_the_kl_its_construction_gives(mass: float) -> None:
    rng = np.random.default_rng(55)
    mode = LossyMode(runner_up_mass=mass)
    low, high = mixed_kl(0.5, mass), -math.log(1 - mass)
    for scale in (0.5, 2.0, 6.0):  # flat to peaked next-byte distributions
        for _ in range(50):
            z = _logits(rng, scale)
            p = softmax(z.astype(np.float64))
            q = softmax(mode.logits(z).astype(np.float64))
            kl = float(rel_entr(p, q).sum())
            second = float(np.sort(p)[-2])
            assert kl == pytest.approx(mixed_kl(second, mass), rel=1e-4, abs=1e-9)
            assert low * (1 - 1e-4) <= kl <= high * (1 + 1e-4)
            # What the harness measures from each side's top 5 is the whole divergence.
            measured = position_kl(top_logprobs(z, 5), top_logprobs(mode.logits(z), 5))
            assert measured == pytest.approx(kl, rel=1e-3, abs=1e-9)


def test_flips_hit_their_share_and_repeat() -> None:
    mode = LossyMode(flip_pct=10)
    draws = [mode.flips(7, b"prompt %d" % i, k) for i in range(400) for k in range(12)]
    # 4,800 draws at 10%: the band holds 480 within about 4.4 binomial deviations.
    assert 390 <= sum(draws) <= 570
    again = [mode.flips(7, b"prompt %d" % i, k) for i in range(400) for k in range(12)]
    assert draws == again
    other_seed = [mode.flips(8, b"prompt %d" % i, k) for i in range(400) for k in range(12)]
    assert draws != other_seed
    assert not LossyMode().flips(7, b"prompt", 0)


def test_flipped_outputs_keep_the_agreement_their_rate_gives() -> None:
    """Real generations on the reference model: the share of each output before its first
    difference, averaged over prompts, sits where the geometric law of the flips puts it."""
    cfg = ModelConfig(layers=2, experts=8, top_k=2, d_model=32, d_ff=32, seed=3)
    exact = Engine(cfg, EngineOptions(hot_slots=8, expert_bytes=0))
    lossy = Engine(cfg, EngineOptions(hot_slots=8, expert_bytes=0, lossy=LossyMode(flip_pct=10)))
    shares = []
    for i in range(150):
        prompt = b"prompt number %d" % i
        want = list(exact.generate(prompt, 12))
        got = list(lossy.generate(prompt, 12))
        same = next((k for k, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), 12)
        shares.append(same / 12)
    # 150 prompts: the mean's standard error is about 0.03 around 0.538.
    assert abs(float(np.mean(shares)) - flip_agreement(10, 12)) < 0.1
    assert flip_agreement(0.5, 12) == pytest.approx(0.968, abs=5e-4)


def test_scale_logits_keeps_every_greedy_token_and_moves_log_probabilities() -> None:
    """``fault: scale-logits`` on the faults bench's 20 weights seeds: the canaries' greedy
    tokens are the exact model's, and some token's log-probability moves by more than twice
    the default tolerance, so only the log-probabilities can catch it, and they do."""
    tolerance = Canaries().logprob_tolerance
    for seed in range(FIRST_SEED, FIRST_SEED + 20):
        cfg = ModelConfig(layers=2, experts=8, seed=seed)
        exact = Engine(cfg, EngineOptions(hot_slots=8, expert_bytes=0))
        scaled = Engine(cfg, EngineOptions(hot_slots=8, expert_bytes=0, fault="scale-logits"))
        moved = 0.0
        for text in CANARY_PROMPTS[:3]:
            want_logits: list[np.ndarray] = []
            got_logits: list[np.ndarray] = []
            want = list(exact.generate(text.encode(), 16, logits_out=want_logits))
            got = list(scaled.generate(text.encode(), 16, logits_out=got_logits))
            assert got == want, (seed, text)
            for token, a, b in zip(want, want_logits, got_logits, strict=True):
                moved = max(moved, abs(chosen_logprob(b, token) - chosen_logprob(a, token)))
        assert moved > 2 * tolerance, (seed, moved)
