"""Which decoder layers, embedding, MTP modules and loss each pipeline virtual stage holds.

One function, :func:`assign`, turns (num_layers, mtp modules, pp, vpp) and Megatron-Core's layout
flags into the per-virtual-stage assignment that legality, memory and the pipeline simulator read:

- nothing set: ``num_layers / (pp*vpp)`` layers per virtual stage (must divide);
- ``decoder_first_pipeline_num_layers`` / ``decoder_last_pipeline_num_layers`` (Megatron
  ``--decoder-first/last-pipeline-num-layers``): layers on the first / last pipeline *rank*; the
  rest split evenly over the other ranks; every rank's count splits evenly over its vpp chunks;
- ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: the
  embedding (loss) counts as one layer, so pp*vpp must divide ``num_layers + 1 (+ 1)`` and the first
  (last) virtual stage holds one decoder layer fewer;
- ``pipeline_model_parallel_layout``: Megatron-Core's ``PipelineParallelLayerLayout`` string, e.g.
  ``"Et*3|(tt|)*29,m|L"``: ``E`` embedding, ``t`` decoder layer, ``m`` MTP module, ``L`` output layer
  and loss; ``|`` ends a virtual stage; ``X*n`` and ``(...)*n`` repeat; commas and spaces are ignored.

Virtual stages are in forward order: with Megatron's interleaved schedule stage ``v`` lives on
pp rank ``v % pp``, chunk ``v // pp`` (stage = chunk*pp + rank); V-shape schedules map them by
:func:`oracle.pipeline.types.virtual_stage`. Without a layout string the MTP modules share the last
stage with the loss (Megatron's post-process stage).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from oracle.errors import InvalidConfigError

if TYPE_CHECKING:
    from oracle.model_card import ModelCard

LAYER_TYPES = {"E": "embedding", "t": "decoder layer", "m": "MTP module", "L": "output layer + loss"}
MAX_LAYOUT_ITEMS = 1_000_000
"""Longest expanded layout string accepted (a typo like t*99999999999 fails fast instead of filling memory)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualStage:
    """One contiguous slice of the model in forward order."""

    layers: tuple[int, ...]
    """Decoder layer indices held here (0-based, contiguous)."""
    embedding: bool = False
    """Holds the input embedding (always virtual stage 0)."""
    mtp: int = 0
    """MTP modules held here."""
    loss: bool = False
    """Holds the final norm, output layer and loss (always the last virtual stage)."""

    def items(self) -> str:
        """The stage in layout letters, e.g. ``Etttt``."""
        return "E" * self.embedding + "t" * len(self.layers) + "m" * self.mtp + "L" * self.loss


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineAssignment:
    """The layer assignment of every virtual stage (``pp*vpp`` of them, forward order)."""

    pp: int
    vpp: int
    stages: tuple[VirtualStage, ...]
    method: str
    """How it was derived: even | first_last | account_for | layout."""
    _memo: dict = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)

    def by_rank(self, v_shape: bool = False) -> tuple[tuple[VirtualStage, ...], ...]:
        """``by_rank(v_shape)[rank][chunk]``: the stage that (rank, chunk) hosts. Megatron's interleaved
        map: stage chunk*pp + rank; V-shape schedules: rank r hosts stages r and 2*pp-1-r (memoised)."""
        hit = self._memo.get(v_shape)
        if hit is None:
            pp = self.pp
            hit = tuple(tuple(self.stages[(r if c == 0 else 2 * pp - 1 - r) if v_shape else c * pp + r]
                              for c in range(self.vpp)) for r in range(pp))
            self._memo[v_shape] = hit
        return hit

    def layers_by_rank(self, v_shape: bool = False) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """``[rank][chunk]`` = decoder layer indices (memoised)."""
        key = ("layers", v_shape)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = tuple(tuple(s.layers for s in row) for row in self.by_rank(v_shape))
        return hit

    @property
    def layer_counts(self) -> tuple[int, ...]:
        """Decoder layers per virtual stage, forward order."""
        return tuple(len(s.layers) for s in self.stages)

    def rank_layer_counts(self, v_shape: bool = False) -> tuple[int, ...]:
        """Decoder layers per pp rank (all its chunks)."""
        return tuple(sum(len(s.layers) for s in row) for row in self.by_rank(v_shape))

    def layout_string(self) -> str:
        """Megatron's string form of this assignment (compressed; :func:`parse_layout` reads it back)."""
        return format_layout(tuple(s.items() for s in self.stages))


# ----------------------------------------------------------------------------------- the string form
def parse_layout(text: str) -> tuple[str, ...]:
    """Megatron's layout string -> one letter string per virtual stage (forward order).

    Grammar (Megatron-Core ``PipelineParallelLayerLayout.parse_str_to_list``, with nesting): letters
    E t m L; ``|`` ends a stage; ``X*n`` repeats a letter, ``(...)*n`` a group (which may contain
    ``|``); commas and whitespace are ignored.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidConfigError(f"pipeline_model_parallel_layout={text!r} must be a non-empty string such as "
                                 f"'Et*3|(tt|)*29,m|L'")
    flat, pos = _expand(text, 0, 0)
    if pos != len(text):  # a stray ')'
        raise InvalidConfigError(f"pipeline_model_parallel_layout={text!r}: unmatched ')' at position {pos}")
    return tuple(flat.split("|"))


def _expand(text: str, pos: int, depth: int) -> tuple[str, int]:
    out: list[str] = []
    while pos < len(text):
        c = text[pos]
        if c in " ,\t\n":
            pos += 1
            continue
        if c == ")":  # the caller checks it closes a group (a stray one ends the parse early)
            return "".join(out), pos
        if c == "(":
            atom, pos = _expand(text, pos + 1, depth + 1)
            if pos >= len(text) or text[pos] != ")":
                raise InvalidConfigError(f"pipeline_model_parallel_layout={text!r}: '(' without a matching ')'")
            pos += 1
        elif c in LAYER_TYPES or c == "|":
            atom, pos = c, pos + 1
        else:
            raise InvalidConfigError(
                f"pipeline_model_parallel_layout={text!r}: unknown character {c!r} at position {pos}; valid: "
                + ", ".join(f"{k} ({v})" for k, v in LAYER_TYPES.items()) + ", | (stage end), X*n, (...)*n")
        if pos < len(text) and text[pos] == "*":
            end = pos + 1
            while end < len(text) and text[end].isdigit():
                end += 1
            if end == pos + 1 or int(text[pos + 1:end]) < 1:
                raise InvalidConfigError(f"pipeline_model_parallel_layout={text!r}: '*' at position {pos} must be "
                                         f"followed by a positive repeat count")
            reps = int(text[pos + 1:end])
            if len(atom) * reps > MAX_LAYOUT_ITEMS:
                raise InvalidConfigError(f"pipeline_model_parallel_layout={text!r}: '*{reps}' at position {pos} "
                                         f"expands past {MAX_LAYOUT_ITEMS} items")
            atom *= reps
            pos = end
        out.append(atom)
        if sum(map(len, out)) > MAX_LAYOUT_ITEMS:
            raise InvalidConfigError(f"pipeline_model_parallel_layout={text!r} expands past {MAX_LAYOUT_ITEMS} items")
    if depth:
        raise InvalidConfigError(f"pipeline_model_parallel_layout={text!r}: '(' without a matching ')'")
    return "".join(out), pos


def _stage_text(items: str) -> str:
    out, i = [], 0
    while i < len(items):
        j = i
        while j < len(items) and items[j] == items[i]:
            j += 1
        n = j - i
        out.append(f"{items[i]}*{n}" if n > 2 else items[i] * n)
        i = j
    return "".join(out)


def format_layout(stages: tuple[str, ...]) -> str:
    """Compressed layout string of per-stage letter strings (runs of equal stages as ``(..|)*n``)."""
    parts: list[str] = []
    i, n = 0, len(stages)
    while i < n:
        j = i
        while j + 1 < n - 1 and stages[j + 1] == stages[i]:  # never fold the last stage into a run
            j += 1
        k = j - i + 1
        text = _stage_text(stages[i])
        if i == n - 1:
            parts.append(text)
        elif k >= 2:
            parts.append(f"({text}|)*{k}" + ("," if j + 1 < n else ""))
        else:
            parts.append(text + "|")
        i = j + 1
    return "".join(parts)


# ----------------------------------------------------------------------------------- assignment
def _from_counts(counts: list[int], mtp: int, method: str, pp: int, vpp: int) -> PipelineAssignment:
    stages, start = [], 0
    last = len(counts) - 1
    for v, c in enumerate(counts):
        stages.append(VirtualStage(layers=tuple(range(start, start + c)), embedding=v == 0, loss=v == last,
                                   mtp=mtp if v == last else 0))
        start += c
    return PipelineAssignment(pp=pp, vpp=vpp, stages=tuple(stages), method=method)


def _grid(pp: int, vpp: int) -> str:
    return f"pp*vpp = {pp}*{vpp} = {pp * vpp}"


class _NoTile(InvalidConfigError):
    """The keys parse but do not tile the layers (the message gains concrete suggestions)."""


def assign(num_layers: int, pp: int, vpp: int, *, mtp_layers: int = 0, first: int | None = None,
           last: int | None = None, layout: str | None = None, account_for_embedding: bool = False,
           account_for_loss: bool = False, model: str = "model",
           weights: StageWeights | Callable[[], StageWeights] | None = None) -> PipelineAssignment:
    """The per-virtual-stage assignment; InvalidConfigError naming the values when they do not tile
    ``num_layers`` exactly (see the module doc for Megatron's rules) and suggesting keys that would,
    balanced under ``weights`` (:func:`card_weights`, or a function returning them, called only then;
    default Megatron's layer-count convention)."""
    out = _assign_or_error(num_layers, pp, vpp, mtp_layers, first, last, layout, account_for_embedding,
                           account_for_loss, model)
    if isinstance(out, _NoTile):
        w = weights() if callable(weights) else weights
        raise InvalidConfigError(str(out) + _suggestion(num_layers, pp, vpp, mtp_layers, w))
    if isinstance(out, InvalidConfigError):
        raise InvalidConfigError(out.problems)
    return out


@lru_cache(maxsize=4096)
def _assign_or_error(*args) -> PipelineAssignment | InvalidConfigError:
    """:func:`_assign`, with its refusal cached too (searches ask about the same illegal split often)."""
    try:
        return _assign(*args)
    except InvalidConfigError as exc:
        return exc


def _assign(num_layers: int, pp: int, vpp: int, mtp: int, first: int | None, last: int | None,
            layout: str | None, acc_e: bool, acc_l: bool, model: str) -> PipelineAssignment:
    n_virtual = pp * vpp
    uneven_keys = [k for k, v in (("decoder_first_pipeline_num_layers", first),
                                  ("decoder_last_pipeline_num_layers", last)) if v is not None]
    account_keys = [k for k, v in (("account_for_embedding_in_pipeline_split", acc_e),
                                   ("account_for_loss_in_pipeline_split", acc_l)) if v]
    if layout is not None:
        if uneven_keys or account_keys:
            raise InvalidConfigError(f"pipeline_model_parallel_layout cannot be combined with "
                                     f"{', '.join(uneven_keys + account_keys)} (Megatron takes one or the other); "
                                     f"the layout string already places every layer")
        return _from_layout(layout, num_layers, mtp, pp, vpp, model)
    if uneven_keys and account_keys:
        raise InvalidConfigError(f"{', '.join(uneven_keys)} cannot be combined with {', '.join(account_keys)} "
                                 f"(Megatron takes one or the other)")
    if account_keys:
        total = num_layers + acc_e + acc_l
        what = " + ".join(["num_layers"] + ["1 (embedding)"] * acc_e + ["1 (loss)"] * acc_l)
        if total % n_virtual or total < n_virtual:
            raise _NoTile(
                f"{model}: {what} = {total} does not split evenly over {_grid(pp, vpp)} virtual stages "
                f"({', '.join(account_keys)})")
        per = total // n_virtual
        counts = [per] * n_virtual
        counts[0] -= acc_e
        counts[-1] -= acc_l
        return _from_counts(counts, mtp, "account_for", pp, vpp)
    if uneven_keys:
        return _first_last(num_layers, pp, vpp, mtp, first, last, model)
    if num_layers % n_virtual:
        raise _NoTile(f"{model}: num_layers={num_layers} is not divisible by {_grid(pp, vpp)}")
    return _from_counts([num_layers // n_virtual] * n_virtual, mtp, "even", pp, vpp)


def _first_last(num_layers: int, pp: int, vpp: int, mtp: int, first: int | None, last: int | None,
                model: str) -> PipelineAssignment:
    for k, v in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last)):
        if v is not None and v < 0:
            raise InvalidConfigError(f"{k}={v} must be >= 0")
    if pp == 1:
        raise InvalidConfigError("decoder_first/last_pipeline_num_layers need pp > 1 (pp=1 has one stage)")
    given = (first or 0) + (last or 0)
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - given
    if middle == 0:
        if rest:
            raise _NoTile(
                f"{model}: decoder_first_pipeline_num_layers + decoder_last_pipeline_num_layers = {given} must "
                f"equal num_layers={num_layers} when pp=2")
        per_rank = [first, last]
    else:
        if rest < 0 or rest % middle:
            raise _NoTile(
                f"{model}: the {rest} decoder layers left after decoder_first/last_pipeline_num_layers "
                f"(num_layers={num_layers} - {given}) do not split evenly over the {middle} other pipeline "
                f"ranks")
        per_rank = [rest // middle] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    bad = [(r, c) for r, c in enumerate(per_rank) if c % vpp]
    if bad:
        r, c = bad[0]
        raise _NoTile(
            f"{model}: pipeline rank {r} would hold {c} decoder layers, which do not split into vpp={vpp} "
            f"equal chunks (Megatron splits each rank's layers evenly over its chunks)")
    counts = [0] * (pp * vpp)
    for r, c in enumerate(per_rank):
        for ch in range(vpp):
            counts[ch * pp + r] = c // vpp
    return _from_counts(counts, mtp, "first_last", pp, vpp)


def _from_layout(text: str, num_layers: int, mtp: int, pp: int, vpp: int, model: str) -> PipelineAssignment:
    stages = parse_layout(text)
    n_virtual = pp * vpp
    where = f"pipeline_model_parallel_layout={text!r}"
    if len(stages) != n_virtual:
        hint = (f"; or set vpp={len(stages) // pp}" if len(stages) % pp == 0 and len(stages) >= pp else "")
        raise InvalidConfigError(f"{where} has {len(stages)} virtual stages; {_grid(pp, vpp)} needs exactly "
                                 f"that many{hint}")
    flat = "".join(stages)
    problems = []
    n_t, n_m = flat.count("t"), flat.count("m")
    if n_t != num_layers:
        problems.append(f"{where} places {n_t} decoder layers (t); {model} has num_layers={num_layers}")
    if n_m != mtp:
        problems.append(f"{where} places {n_m} MTP modules (m); {model} has {mtp}")
    if flat.count("E") != 1 or not stages[0].startswith("E"):
        problems.append(f"{where}: the embedding E must appear exactly once, first in the first stage")
    if flat.count("L") != 1 or not stages[-1].endswith("L"):
        problems.append(f"{where}: the loss L must appear exactly once, last in the last stage")
    if n_m and "t" in flat[flat.index("m"):]:
        problems.append(f"{where}: MTP modules (m) take the final hidden states, so they must follow every "
                        f"decoder layer (t)")
    if n_m and sum("m" in st for st in stages) > 1:
        problems.append(f"{where}: all {n_m} MTP modules (m) must sit in one virtual stage")
    if problems:
        raise InvalidConfigError(problems)
    out, start = [], 0
    for s in stages:
        c = s.count("t")
        out.append(VirtualStage(layers=tuple(range(start, start + c)), embedding="E" in s, loss="L" in s,
                                mtp=s.count("m")))
        start += c
    return PipelineAssignment(pp=pp, vpp=vpp, stages=tuple(out), method="layout")


# ----------------------------------------------------------------------------------- choosing one
@dataclass(frozen=True, slots=True, kw_only=True)
class StageWeights:
    """Relative cost of what a stage can hold, for balancing (decoder-layer units)."""

    layers: tuple[float, ...]
    """Per decoder layer, in model order."""
    embedding: float
    loss: float
    """Final norm, output layer and loss."""
    mtp: float
    """One MTP module."""

    @classmethod
    def megatron(cls, num_layers: int) -> "StageWeights":
        """Megatron's convention (account_for_*_in_pipeline_split): embedding and loss one layer each;
        an MTP module is a decoder layer plus its own output layer and loss, two."""
        return cls(layers=(1.0,) * num_layers, embedding=1.0, loss=1.0, mtp=2.0)

    def stage_load(self, st: VirtualStage) -> float:
        return (sum(self.layers[i] for i in st.layers) + self.embedding * st.embedding + self.loss * st.loss
                + self.mtp * st.mtp)


def card_weights(card: ModelCard) -> StageWeights:
    """Per-token GEMM work of each part of ``card`` (the weights a token multiplies through: 2 FLOPs per
    weight, Kaplan et al. 2020's 6N rule per layer; MoE layers count their top-k experts), relative to
    the mean decoder layer. The embedding is a lookup (no GEMM) and weighs 0; the output layer weighs
    V*H; an MTP module its 2H*H projection, one decoder layer (MoE for MoE models) and an output layer.
    Attention's sequence-quadratic part is the same in every layer and left out."""
    def active(kind: str) -> float:
        return float(card.layer_params(kind, experts=card.moe_topk))
    per_layer = [active(k) for k in card.layer_kinds]
    if card.hybrid_pairs:  # Megatron's pipeline splits (mixer, MLP) pairs: one weight per pair
        per_layer = [per_layer[i] + per_layer[i + 1] for i in range(0, len(per_layer), 2)]
    mean = sum(per_layer) / len(per_layer)
    head = float(card.padded_vocab() * card.hidden_size)
    kind = "moe" if card.is_moe else "dense"
    mtp = 2.0 * card.hidden_size ** 2 + active(kind) + head
    return StageWeights(layers=tuple(x / mean for x in per_layer), embedding=0.0, loss=head / mean, mtp=mtp / mean)


@lru_cache(maxsize=256)
def pattern_positions(a: PipelineAssignment, per_layer: int) -> PipelineAssignment:
    """``a`` with each layer index i standing for ``per_layer`` consecutive pattern positions (i*per_layer, ...):
    a hybrid_pairs card's stages from an assignment of its transformer layers."""
    stages = tuple(VirtualStage(layers=tuple(range(s.layers[0] * per_layer, (s.layers[-1] + 1) * per_layer))
                                if s.layers else (), embedding=s.embedding, mtp=s.mtp, loss=s.loss) for s in a.stages)
    return PipelineAssignment(pp=a.pp, vpp=a.vpp, stages=stages, method=a.method)


def _load_key(a: PipelineAssignment, w: StageWeights) -> tuple[float, float, float]:
    """Smaller is better balanced: (heaviest rank under the interleaved map, heaviest virtual stage,
    spread of stage loads)."""
    stage_w = [round(w.stage_load(s), 9) for s in a.stages]
    rank_w = [round(sum(stage_w[c * a.pp + r] for c in range(a.vpp)), 9) for r in range(a.pp)]
    return max(rank_w), max(stage_w), sum(x * x for x in stage_w)


@lru_cache(maxsize=1024)
def balanced_first_last(num_layers: int, pp: int, vpp: int, mtp: int = 0,
                        weights: StageWeights | None = None) -> tuple[int, int] | None:
    """The (decoder_first, decoder_last) pair that best balances the pipeline ranks under ``weights``
    (default :meth:`StageWeights.megatron`), or None when no pair tiles the layers."""
    if pp < 2:
        return None
    w = weights or StageWeights.megatron(num_layers)
    best: tuple[tuple, tuple[int, int]] | None = None
    middles = [0] if pp == 2 else range(0, num_layers // (pp - 2) + 1, vpp)
    for k in middles:
        for f in range(0, num_layers - k * (pp - 2) + 1, vpp):
            last = num_layers - k * (pp - 2) - f
            if last % vpp:
                continue
            a = _first_last(num_layers, pp, vpp, mtp, f, last, "model")
            key = (_load_key(a, w), abs(f - last))
            if best is None or key < best[0]:
                best = (key, (f, last))
    return best[1] if best else None


def _partition(w: StageWeights, n_virtual: int, mtp: int, cap: float, tail_cap: float) -> list[int] | None:
    """Front-filled contiguous split with every stage's load <= cap, the last stage's <= tail_cap
    (None if impossible)."""
    counts = [0] * n_virtual
    i, n = 0, len(w.layers)
    for v in range(n_virtual):
        last = v == n_virtual - 1
        room = (tail_cap if last else cap) - (w.embedding if v == 0 else 0.0)
        if last:
            room -= w.loss + w.mtp * mtp
        if room < -1e-9:
            return None
        while i < n and w.layers[i] <= room + 1e-9:
            room -= w.layers[i]
            counts[v] += 1
            i += 1
    return counts if i == n else None


def _bisect(feasible, hi: float) -> float:
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return hi


@lru_cache(maxsize=1024)
def balanced_layout(num_layers: int, pp: int, vpp: int, mtp: int = 0, weights: StageWeights | None = None) -> str:
    """The layout string whose heaviest virtual stage is lightest: a contiguous min-max partition of
    the layers under ``weights`` (embedding on the first stage, MTP and loss on the last), then the
    lightest cap for the other stages given the last one's (the MTP and loss can outweigh a stage by
    themselves); bisection on the capacity with a front-filled greedy check."""
    w = weights or StageWeights.megatron(num_layers)
    n_virtual = pp * vpp
    top = sum(w.layers) + w.embedding + w.loss + w.mtp * mtp
    cap = _bisect(lambda c: _partition(w, n_virtual, mtp, c, c) is not None, top)
    body = _bisect(lambda c: _partition(w, n_virtual, mtp, c, cap) is not None, cap)
    counts = _partition(w, n_virtual, mtp, body, cap)
    assert counts is not None
    return _from_counts(counts, mtp, "layout", pp, vpp).layout_string()


def uneven_options(num_layers: int, pp: int, vpp: int, mtp: int = 0,
                   weights: StageWeights | None = None) -> list[dict[str, object]]:
    """Training-key settings that tile ``num_layers`` over pp*vpp virtual stages, the best balanced
    under ``weights`` first (ties: first/last, then account_for, then a layout string)."""
    return [dict(o) for o in _uneven_options(num_layers, pp, vpp, mtp, weights)]


@lru_cache(maxsize=1024)
def _uneven_options(num_layers: int, pp: int, vpp: int, mtp: int,
                    weights: StageWeights | None) -> tuple[dict[str, object], ...]:
    w = weights or StageWeights.megatron(num_layers)
    n_virtual = pp * vpp
    cands: list[tuple[tuple, int, dict[str, object]]] = []
    fl = balanced_first_last(num_layers, pp, vpp, mtp, weights)
    if fl is not None:
        a = _first_last(num_layers, pp, vpp, mtp, fl[0], fl[1], "model")
        cands.append((_load_key(a, w), 0, {"decoder_first_pipeline_num_layers": fl[0],
                                           "decoder_last_pipeline_num_layers": fl[1]}))
    for e, lo in ((True, True), (True, False), (False, True)):
        total = num_layers + e + lo
        if n_virtual > 1 and total % n_virtual == 0 and total >= n_virtual:
            a = _assign(num_layers, pp, vpp, mtp, None, None, None, e, lo, "model")
            keys: dict[str, object] = {}
            if e:
                keys["account_for_embedding_in_pipeline_split"] = True
            if lo:
                keys["account_for_loss_in_pipeline_split"] = True
            cands.append((_load_key(a, w), 1, keys))
    if n_virtual > 1:
        text = balanced_layout(num_layers, pp, vpp, mtp, weights)
        a = _from_layout(text, num_layers, mtp, pp, vpp, "model")
        cands.append((_load_key(a, w), 2, {"pipeline_model_parallel_layout": text}))
    cands.sort(key=lambda c: (c[0][0], c[0][1], c[1], c[0][2]))
    return tuple(c[2] for c in cands)


def _fmt(keys: dict[str, object]) -> str:
    return ", ".join(f"{k}={'true' if v is True else repr(v) if isinstance(v, str) else v}" for k, v in keys.items())


def _suggestion(num_layers: int, pp: int, vpp: int, mtp: int, weights: StageWeights | None = None) -> str:
    opts = uneven_options(num_layers, pp, vpp, mtp, weights)
    if not opts:
        return f"; an uneven layout needs pp > 1 (or use a vpp that divides num_layers={num_layers})"
    shown = " or ".join(f"[{_fmt(o)}]" for o in opts[:3])
    return f"; set an uneven layout that tiles the {num_layers} layers, e.g. {shown}"


# ----------------------------------------------------------------------------------- recipes
def splits_evenly(num_layers: int, pp: int, vpp: int) -> bool:
    """The decoder layers divide over the pp*vpp virtual stages (or there is one): no uneven layout is needed."""
    n_virtual = pp * vpp
    return n_virtual <= 1 or num_layers % n_virtual == 0


def recipe_layout(num_layers: int, pp: int, vpp: int, mtp: int = 0) -> tuple[dict[str, object], str] | None:
    """The uneven layout NVIDIA's recipes use when num_layers does not divide pp*vpp, as training keys
    plus a one-line source note; None when the even split works or no rule applies.

    Rules (docs/accuracy.md, "Uneven pipeline layouts assumed for published rows"):
    - num_layers + 2 divides pp*vpp: account_for_embedding/loss_in_pipeline_split (Megatron-Bridge's
      Llama 3.1 405B recipes: 126 + 2 = 128 layer slots).
    - otherwise (DeepSeek-V3 family): a pipeline_model_parallel_layout with the embedding in the
      first stage and the MTP modules and loss in the last (Megatron-Bridge's DeepSeek-V3 layout
      map): every stage but the last holds ceil(L / V) decoder layers and the last the remainder; when
      that leaves nothing for the last stage, the MTP modules and the loss get a stage each and the
      other V-2 stages hold floor(L / (V-2)) layers, the first one taking the remainder (Megatron-LM's
      DeepSeek-V3 example 'Et*3|(tt|)*29,m|L' for V = 32).
    """
    n_virtual = pp * vpp
    if splits_evenly(num_layers, pp, vpp):
        return None
    if (num_layers + 2) % n_virtual == 0:
        return ({"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True},
                f"recipe rule: embedding and loss count as layers, {num_layers}+2 = {num_layers + 2} over "
                f"{n_virtual} stages, the rule of Megatron-Bridge's Llama 3.1 405B recipes")
    per = math.ceil(num_layers / n_virtual)
    rest = num_layers - per * (n_virtual - 1)
    if rest >= 1:
        counts = [per] * (n_virtual - 1) + [rest]
        stages = ["E" * (v == 0) + "t" * c for v, c in enumerate(counts)]
        stages[-1] += "m" * mtp + "L"
        rule = (f"recipe rule: embedding first, {per} layers per stage, the last {rest} with {'MTP and ' * bool(mtp)}loss, "
                f"the rule of Megatron-Bridge's DeepSeek-V3 recipes")
    elif n_virtual > 1 + bool(mtp):
        tail = ["m" * mtp] * bool(mtp) + ["L"]
        n_body = n_virtual - len(tail)
        per = num_layers // n_body
        counts = [per] * n_body
        extra = num_layers - per * n_body
        if extra <= per:  # Megatron-LM's DeepSeek-V3 layout: the first stage takes the remainder
            counts[0] += extra
            how = "the first takes the remainder"
        else:  # a remainder larger than a stage would make the first stage the bottleneck: one more each
            counts = [per + (v < extra) for v in range(n_body)]
            how = f"the first {extra} take one more"
        stages = ["E" * (v == 0) + "t" * c for v, c in enumerate(counts)] + tail
        rule = (f"recipe rule: {'MTP and ' * bool(mtp)}loss on stages of their own, {per} layers per other "
                f"stage, {how}, the rule of Megatron-LM's DeepSeek-V3 layout")
    else:
        return None
    return {"pipeline_model_parallel_layout": format_layout(tuple(stages))}, rule
