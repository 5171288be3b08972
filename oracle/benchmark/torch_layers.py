"""Real torch layers built from a :class:`~oracle.benchmark.spec.LayerSpec` (imports torch).

Each decoder layer is a chain of named op modules whose names match the simulate side's layer parts
(attn_norm, qkv, attn_core, attn_out, mlp_norm, mlp_up, mlp_act, mlp_down; MoE: router, permute,
experts_up, experts_act, experts_down, unpermute, shared_mlp), so benchmark and simulate line up op by op.
The same modules build the CPU end-to-end trainer's model, so what is benchmarked is what is trained.

Attention is torch's scaled_dot_product_attention: causal (``is_causal``) for full attention, an explicit
boolean mask for sliding windows and context-parallel query shards; GQA via ``enable_gqa``; MLA follows
DeepSeek-V3's projections (optional query LoRA, compressed KV latent with a shared rotary key part).
MoE dispatch is balanced by construction (paper Sec. 4.10: a straight-through router whose top-k scores
weight an exactly even assignment of token copies to the rank's experts), so grouped GEMMs are batched
matmuls of equal groups. Not modelled: gpt-oss attention sinks (one extra logit per head: negligible work),
biases other than the card's linear/qkv/router flags, MTP's extra projection (an MTP module is timed as a
decoder layer plus the output head, as simulate prices it).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from oracle.benchmark.spec import LayerSpec

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
ROPE_THETA = 10000.0


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def _norm(kind: str, width: int) -> nn.Module:
    return nn.LayerNorm(width) if kind == "layernorm" else nn.RMSNorm(width, eps=1e-6)


def _act(name: str, x: torch.Tensor) -> torch.Tensor:
    if name in ("swiglu", "geglu"):
        a, b = x.chunk(2, dim=-1)
        return (F.silu(a) if name == "swiglu" else F.gelu(a, approximate="tanh")) * b
    if name == "gelu":
        return F.gelu(x, approximate="tanh")
    if name == "squared_relu":
        return F.relu(x).square()
    return F.relu(x)


class Act(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name_ = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _act(self.name_, x)


def _rope_tables(seq: int, dim: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


def query_positions(spec: LayerSpec) -> list[int] | None:
    """Global positions of this rank's queries under load-balanced CP (rank 0: chunks 0 and 2cp-1), or None."""
    if spec.cp == 1:
        return None
    c = spec.seq_k // (2 * spec.cp)
    return list(range(0, c)) + list(range(spec.seq_k - c, spec.seq_k))


def attention_mask(spec: LayerSpec, device) -> torch.Tensor | None:
    """Boolean [seq_q, seq_k] mask (True = attend), or None when ``is_causal`` suffices."""
    pos = query_positions(spec)
    if spec.window is None and pos is None:
        return None
    q = torch.tensor(pos, device=device) if pos is not None else torch.arange(spec.seq_q, device=device)
    k = torch.arange(spec.seq_k, device=device)
    mask = k[None, :] <= q[:, None]
    if spec.window is not None:
        mask &= k[None, :] > q[:, None] - spec.window
    return mask


def _unfused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                       gqa: bool) -> torch.Tensor:
    """Attention with its scores in memory (Transformer Engine UnfusedDotProductAttention): K and V repeated to
    every query head, Q K^T scaled, the mask applied and the softmax taken in fp32, probabilities in the input
    dtype times V. [b, heads, s_q, d] -> [b, heads, s_q, d_v]."""
    if gqa:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    probs = torch.softmax(scores.float().masked_fill(~mask, float("-inf")), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)


class AttnCore(nn.Module):
    """Split the fused projection, apply qk-norm and RoPE, run SDPA; [b, s, proj] -> [b, s, heads*d_v]."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        self.s = spec
        self.mla = spec.attention == "mla"
        self.d_rope = spec.qk_rope_head_dim if self.mla else spec.head_dim
        if spec.qk_layernorm and not self.mla:
            self.q_norm = _norm(spec.norm, spec.head_dim)
            self.k_norm = _norm(spec.norm, spec.head_dim)
        self._tables: dict = {}

    def _masks(self, device, dtype):
        k = (str(device), dtype)
        if k not in self._tables:
            cos, sin = _rope_tables(self.s.seq_k, self.d_rope, device, dtype)
            pos = query_positions(self.s)
            qcos, qsin = (cos[pos], sin[pos]) if pos is not None else (cos[:self.s.seq_q], sin[:self.s.seq_q])
            self._tables[k] = (cos, sin, qcos, qsin, attention_mask(self.s, device))
        return self._tables[k]

    def forward(self, proj: torch.Tensor) -> torch.Tensor:
        s = self.s
        b, n = proj.shape[0], proj.shape[1]
        cos, sin, qcos, qsin, mask = self._masks(proj.device, proj.dtype)
        if self.mla:
            dq = s.qk_nope_head_dim + s.qk_rope_head_dim
            qw, kvw = s.heads * dq, s.heads * (s.qk_nope_head_dim + s.v_head_dim)
            q, kv, k_rope = proj.split([qw, kvw, s.qk_rope_head_dim], dim=-1)
            q = q.view(b, n, s.heads, dq).transpose(1, 2)
            q_nope, q_pe = q.split([s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)
            kv = kv.view(b, n, s.heads, s.qk_nope_head_dim + s.v_head_dim).transpose(1, 2)
            k_nope, v = kv.split([s.qk_nope_head_dim, s.v_head_dim], dim=-1)
            k_pe = _rope(k_rope.view(b, 1, n, s.qk_rope_head_dim), qcos, qsin).expand(b, s.heads, n, -1)
            q = torch.cat([q_nope, _rope(q_pe, qcos, qsin)], dim=-1)
            k = torch.cat([k_nope, k_pe], dim=-1)
            gqa = False
        else:
            d = s.head_dim
            q, k, v = proj.split([s.heads * d, s.kv_heads * d, s.kv_heads * d], dim=-1)
            q = q.view(b, n, s.heads, d).transpose(1, 2)
            k = k.view(b, n, s.kv_heads, d).transpose(1, 2)
            v = v.view(b, n, s.kv_heads, d).transpose(1, 2)
            if s.qk_layernorm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = _rope(q, qcos, qsin), _rope(k, qcos, qsin)
            gqa = s.kv_heads != s.heads
        if s.cp > 1:  # this rank's queries against the whole sequence's keys (ring attention's total work)
            reps = s.seq_k // n
            k = k.repeat(1, 1, reps, 1)
            v = v.repeat(1, 1, reps, 1)
        if s.unfused:
            o = _unfused_attention(q, k, v, mask, gqa)
        elif mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return o.transpose(1, 2).reshape(b, n, -1)


class MLAProj(nn.Module):
    """DeepSeek-V3 MLA projections: q (LoRA pair with norm, or dense), KV down to the latent (+ shared
    rotary key), latent norm, KV up; output concatenated [q | k_nope,v | k_rope] for AttnCore."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        s, H, bias = spec, spec.hidden, spec.linear_bias
        qw = s.heads * (s.qk_nope_head_dim + s.qk_rope_head_dim)
        if s.q_lora_rank:
            self.q_down = nn.Linear(H, s.q_lora_rank, bias=bias)
            self.q_norm = _norm(s.norm, s.q_lora_rank)
            self.q_up = nn.Linear(s.q_lora_rank, qw, bias=bias)
        else:
            self.q_proj = nn.Linear(H, qw, bias=bias)
        self.kv_down = nn.Linear(H, s.kv_lora_rank + s.qk_rope_head_dim, bias=bias)
        self.kv_norm = _norm(s.norm, s.kv_lora_rank)
        self.kv_up = nn.Linear(s.kv_lora_rank, s.heads * (s.qk_nope_head_dim + s.v_head_dim), bias=bias)
        self.s = s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q_up(self.q_norm(self.q_down(x))) if self.s.q_lora_rank else self.q_proj(x)
        lat, k_rope = self.kv_down(x).split([self.s.kv_lora_rank, self.s.qk_rope_head_dim], dim=-1)
        kv = self.kv_up(self.kv_norm(lat))
        return torch.cat([q, kv, k_rope], dim=-1)


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, activation: str, bias: bool) -> None:
        super().__init__()
        gated = activation in ("swiglu", "geglu")
        self.mlp_up = nn.Linear(hidden, (2 if gated else 1) * ffn, bias=bias)
        self.mlp_act = Act(activation)
        self.mlp_down = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_down(self.mlp_act(self.mlp_up(x)))


class Router(nn.Module):
    """Router logits over all experts, softmax, top-k scores [tokens, k] (fp32, as Megatron)."""

    def __init__(self, hidden: int, experts: int, topk: int, bias: bool) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, experts, bias=bias)
        self.topk = topk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        return probs.topk(self.topk, dim=-1).values


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class Permute(nn.Module):
    """Forced-balanced dispatch as Megatron's all-to-all token dispatcher does it: token copy p (token p // k)
    goes to slot p % (ranks x experts), i.e. EP rank slot // experts, local expert slot % experts; the copies
    are gathered in (rank, local expert) order, groups padded equal, and exchanged (``exchange``: the EP
    all-to-all in a multi-process trainer, nothing in a one-process benchmark). With more than one rank and
    more than one local expert the received chunks are then re-sorted by local expert (Megatron-Core's
    ``sort_chunks_by_idxs``), a real copy that a layout without EP does not make."""

    def __init__(self, tokens: int, topk: int, experts: int, ranks: int = 1) -> None:
        super().__init__()
        pairs = tokens * topk
        slots = experts * ranks
        per = -(-pairs // slots)
        idx: list[list[int]] = [[] for _ in range(slots)]
        for p in range(pairs):
            idx[p % slots].append(p)
        flat, valid = [], []
        for e in range(slots):
            flat += idx[e] + [0] * (per - len(idx[e]))
            valid += [1.0] * len(idx[e]) + [0.0] * (per - len(idx[e]))
        self.register_buffer("pair_index", torch.tensor(flat, dtype=torch.long), persistent=False)
        self.register_buffer("token_index", torch.tensor(flat, dtype=torch.long) // topk, persistent=False)
        self.register_buffer("valid", torch.tensor(valid), persistent=False)
        inverse = [0] * pairs  # row of each token copy in the dispatch-ordered buffer
        for r, (p, ok) in enumerate(zip(flat, valid)):
            if ok:
                inverse[p] = r
        self.register_buffer("inverse", torch.tensor(inverse, dtype=torch.long), persistent=False)
        self.experts, self.ranks, self.per, self.topk = experts, ranks, per, topk
        self.exchange: Callable[[torch.Tensor], torch.Tensor] = _identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        send = x.index_select(0, self.token_index)                                 # [(rank, expert, per), H]
        recv = self.exchange(send).view(self.ranks, self.experts, self.per, x.shape[-1])
        return recv.transpose(0, 1).reshape(self.experts, self.ranks * self.per, x.shape[-1])


class GroupedLinear(nn.Module):
    """``experts`` equal-size GEMMs [E, m, k] @ [E, k, n] (the grouped GEMM of balanced dispatch)."""

    def __init__(self, experts: int, k: int, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, k, n))
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.weight)


class Unpermute(nn.Module):
    """Undo the local-expert sort, exchange back (``exchange``), gather each token's k expert outputs into
    token order and sum them weighted by the router scores (a gather, not an atomic scatter: every token has
    exactly k copies)."""

    def __init__(self, permute: Permute, tokens: int) -> None:
        super().__init__()
        self.p = [permute]  # not a submodule (buffers live on Permute)
        self.tokens = tokens
        self.exchange: Callable[[torch.Tensor], torch.Tensor] = _identity

    def forward(self, y: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        p, H = self.p[0], y.shape[-1]
        back = y.view(p.experts, p.ranks, p.per, H).transpose(0, 1).reshape(-1, H)
        rows = self.exchange(back).index_select(0, p.inverse).view(self.tokens, p.topk, H)
        return (rows * scores.to(y.dtype).unsqueeze(-1)).sum(dim=1)


class MoE(nn.Module):
    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        s = spec
        self.router = Router(s.hidden, s.router_experts, s.topk, s.router_bias)
        self.permute = Permute(s.tokens, s.topk, s.experts, s.ep_ranks)
        up = (2 if s.gated else 1) * s.expert_ffn
        self.experts_up = GroupedLinear(s.experts, s.hidden, up)
        self.experts_act = Act(s.activation)
        self.experts_down = GroupedLinear(s.experts, s.expert_ffn, s.hidden)
        self.unpermute = Unpermute(self.permute, s.tokens)
        self.shared_mlp = MLP(s.hidden, s.shared_ffn, s.activation, s.linear_bias) if s.shared_ffn else None

    def set_exchange(self, exchange: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Route dispatch and combine through ``exchange`` (an all-to-all over ``ep_ranks`` processes)."""
        self.permute.exchange = self.unpermute.exchange = exchange

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        scores = self.router(flat)
        y = self.experts_down(self.experts_act(self.experts_up(self.permute(flat))))
        out = self.unpermute(y, scores).view(shape)
        if self.shared_mlp is not None:
            out = out + self.shared_mlp(x)
        return out


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)); h + mlp(norm(h)); input/output [mbs, seq_q, hidden]."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        s = spec
        self.spec = s
        self.attn_norm = _norm(s.norm, s.hidden)
        if s.attention == "mla":
            self.qkv = MLAProj(s)
            out_in = s.heads * s.v_head_dim
        else:
            self.qkv = nn.Linear(s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim, bias=s.qkv_bias or s.linear_bias)
            out_in = s.heads * s.head_dim
        self.attn_core = AttnCore(s)
        self.attn_out = nn.Linear(out_in, s.hidden, bias=s.linear_bias)
        self.mlp_norm = _norm(s.norm, s.hidden)
        if s.kind == "moe":
            self.moe = MoE(s)
        else:
            self.mlp = MLP(s.hidden, s.ffn, s.activation, s.linear_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn_out(self.attn_core(self.qkv(self.attn_norm(x))))
        z = self.mlp_norm(h)
        return h + (self.moe(z) if self.spec.kind == "moe" else self.mlp(z))


class Embedding(nn.Module):
    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        self.embed = nn.Embedding(spec.vocab, spec.hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)


class OutputLoss(nn.Module):
    """Final norm, logits GEMM and cross-entropy (fp32 softmax); returns the mean loss."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        self.final_norm = _norm(spec.norm, spec.hidden)
        self.logits = nn.Linear(spec.hidden, spec.vocab, bias=False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        z = self.logits(self.final_norm(x))
        return F.cross_entropy(z.float().view(-1, z.shape[-1]), labels.view(-1))


OP_NAMES = ("attn_norm", "qkv", "attn_core", "attn_out", "mlp_norm", "mlp_up", "mlp_act", "mlp_down",
            "router", "permute", "experts_up", "experts_act", "experts_down", "unpermute", "shared_mlp")
GEMM_OPS = ("qkv", "attn_out", "mlp_up", "mlp_down", "experts_up", "experts_down", "shared_mlp")
"""Ops whose time is GEMMs (what an fp8 rescale and a TP compute rescale apply to)."""
EXPERT_OPS = ("permute", "experts_up", "experts_act", "experts_down", "unpermute")
"""Ops split by expert tensor parallelism (ETP) rather than TP."""


def build(spec: LayerSpec, device, dtype: torch.dtype | None = None) -> nn.Module:
    """The torch module of ``spec`` on ``device`` in the spec's dtype."""
    dt = dtype or torch_dtype(spec.dtype)
    if spec.kind in ("dense", "moe"):
        mod: nn.Module = DecoderLayer(spec)
    elif spec.kind == "embedding":
        mod = Embedding(spec)
    else:
        mod = OutputLoss(spec)
    return mod.to(device=device, dtype=dt)


def named_ops(layer: nn.Module) -> dict[str, nn.Module]:
    """The op modules of a decoder layer by simulate-side name (those that exist in this layer)."""
    out = {}
    for name, mod in layer.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if "shared_mlp." in name:  # the shared expert is timed as one op
            continue
        if leaf in OP_NAMES and leaf not in out and mod is not None:
            out[leaf] = mod
    return out
