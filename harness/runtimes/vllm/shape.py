"""The tiny Qwen3-MoE's dimensions, apart from the writer so that the CLI's flags show their
defaults without loading numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TinyQwen3MoeShape"]


@dataclass(frozen=True)
class TinyQwen3MoeShape:
    """The tiny model's dimensions (~1M parameters: boots in seconds, routes like a real MoE)."""

    layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    expert_ff: int = 64
    experts: int = 8
    top_k: int = 2
    max_positions: int = 4096

    def problems(self) -> list[str]:
        """What makes this shape invalid (empty when it is valid)."""
        out = []
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim) < 1:
            out.append("every dimension must be positive")
        elif self.heads % self.kv_heads:
            out.append(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if not 1 <= self.top_k <= self.experts:
            out.append(f"top_k {self.top_k} must be in 1..{self.experts}")
        if self.layers > 64 or self.experts > 256 or self.hidden > 1024:
            out.append(
                "this writer makes tiny test models: layers <= 64, experts <= 256, hidden <= 1024"
            )
        return out
