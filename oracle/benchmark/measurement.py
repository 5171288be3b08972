"""Measured times of one layer signature (plain data, no torch): what the cache stores."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class OpTime:
    """Median forward, input-gradient (B) and weight-gradient (W) seconds of one op, timed standalone."""

    f_s: float
    b_s: float
    w_s: float

    @property
    def total_s(self) -> float:
        return self.f_s + self.b_s + self.w_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One layer signature timed on one device: medians over ``repeats`` after warm-up.

    ``b_s`` is the backward to the layer input only (autograd restricted to the input), ``w_s`` the rest
    of a full backward (weight gradients), matching the zero-bubble B/W split the pipeline simulator uses.
    """

    spec_key: str
    f_s: float
    b_s: float
    w_s: float
    ops: dict[str, OpTime] = field(default_factory=dict)
    params: int = 0
    """Parameters of this layer on the rank."""
    optimizer_s_per_param: float | None = None
    """Adam step (fp32 master weights, write-back to the compute dtype) per parameter."""
    device: str = ""
    repeats: int = 0
    spread: float = 0.0
    """(max - min) / median of the full-layer forward+backward over the repeats (noise indicator)."""
    dtype: str = ""
    """The dtype the layer ran in ('' = the spec's): fp32 on a device without native bf16."""

    def to_dict(self) -> dict[str, Any]:
        return {"spec_key": self.spec_key, "f_s": self.f_s, "b_s": self.b_s, "w_s": self.w_s,
                "ops": {k: {"f_s": v.f_s, "b_s": v.b_s, "w_s": v.w_s} for k, v in self.ops.items()},
                "params": self.params, "optimizer_s_per_param": self.optimizer_s_per_param,
                "device": self.device, "repeats": self.repeats, "spread": self.spread,
                "dtype": self.dtype}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        return cls(spec_key=d["spec_key"], f_s=float(d["f_s"]), b_s=float(d["b_s"]), w_s=float(d["w_s"]),
                   ops={k: OpTime(**v) for k, v in d.get("ops", {}).items()}, params=int(d.get("params", 0)),
                   optimizer_s_per_param=d.get("optimizer_s_per_param"), device=d.get("device", ""),
                   repeats=int(d.get("repeats", 0)), spread=float(d.get("spread", 0.0)), dtype=d.get("dtype", ""))
