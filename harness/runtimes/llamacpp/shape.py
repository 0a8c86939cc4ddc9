"""The tiny llama MoE's dimensions, apart from the writer so that the CLI's flags show their
defaults without loading numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TinyMoeShape"]


@dataclass(frozen=True)
class TinyMoeShape:
    """The dimensions of the tiny model (small enough for CI, large enough that threads matter)."""

    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 256  # per expert
    n_expert: int = 8
    n_expert_used: int = 2
    n_ctx: int = 2048
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0

    def problems(self) -> list[str]:
        """What makes this shape invalid (empty when it is valid)."""
        out = []
        if self.n_embd % self.n_head:
            out.append(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.n_head % self.n_head_kv:
            out.append(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if not 1 <= self.n_expert_used <= self.n_expert:
            out.append(f"n_expert_used {self.n_expert_used} must be in 1..{self.n_expert}")
        if min(self.n_layer, self.n_embd, self.n_ff, self.n_ctx) < 1:
            out.append("every dimension must be positive")
        return out
