"""Fit the achievable-efficiency constants of hardware profiles on a validation CSV, as a whole.

    python benchmarks/calibrate.py ../shared/validation/calibration.csv [--quality A,B] [--hardware h100-sxm]

Profiles are fitted in FAMILIES (parts that share a software stack and kernel libraries):
- a family with many rows (>= 8) gets one multiplier per GEMM precision that appears in its rows, plus
  one joint scale of the attention forward/backward efficiencies when its rows vary the attention
  share (sequence lengths spanning >= 4x);
- a family with few rows gets ONE multiplier shared by every GEMM efficiency of every part in it, so
  the per-part / per-precision ratios stay those of the sourced priors in the YAMLs.
Least squares on log(projected/measured) over ALL the family's rows of the requested quality;
nothing is fitted per row, and a field no row exercises is left alone. The script prints the fitted values, the rows and their errors before/after: paste the values
into the profile YAML with a source line naming this script, the CSV and the row ids (docs/calibration.md).

`--joint CSV [CSV ...]` is the per-GPU-generation fit (docs/kernel-model.md): every generation in
GENERATIONS (each profile's own ``arch``: Hopper, Blackwell, Blackwell Ultra, CDNA3, CDNA4, Ampere) is fitted jointly over the newest release of
each configuration in ALL the CSVs given (quality A/B, rows whose assumed defaults fit in memory and
whose memory settings validate did not have to guess), in one MAP fit: per generation one multiplier on
the GEMM efficiencies, one on attention (when its rows have more than one sequence length), an NVFP4
multiplier (when it has NVFP4 rows) and one on the collective library's all-to-all share (``alltoall_share``, when
it has >= 3 rows whose EP all-to-all is NCCL's/RCCL's); per vendor stack (HOST_GROUPS, the profiles' ``vendor``) one multiplier on the host issue
time per framework op ``host_op_s`` (when the stack has >= 3 MoE rows). It then reports leave-one-model-out and leave-one-part-out errors (each model / part
projected by a fit that never saw it) and, with ``--write``, puts the values into the profile YAMLs with a
source line naming this script, the files and the rows.

`--contrasts` also fits the MoE dispatcher sync stall (``efficiency.moe_sync_stall_s``) of a family on
BATCH CONTRASTS: pairs of rows of one group (one sweep) whose configurations differ only in mbs/gbs.
Their measured ratio isolates what a micro-batch costs besides its tokens, and it does not depend on
the sweep's unpublished fixed settings (they cancel), so rows of any quality serve. The stall and the
family's GEMM multiplier are fitted alternately (contrasts, then absolute A/B rows) to a fixed point.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oracle.hardware import bundled_hardware, load_hardware  # noqa: E402
from oracle.projector import project  # noqa: E402
from oracle.validate import GUESSES  # noqa: E402
from oracle.validate import batch_contrasts as _batch_contrasts  # noqa: E402
from oracle.validate import newest_flags, read_rows, row_to_run, validate_rows  # noqa: E402


def _with_eff(run, **eff):
    hw = run.cluster.hardware
    hw2 = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **eff))
    return dataclasses.replace(run, cluster=dataclasses.replace(run.cluster, hardware=hw2))


def _measured(row):
    v = row.get("measured_tokens_per_s_per_gpu") or ""
    if v.strip():
        return "tokens", float(v)
    return "tflops", float(row["measured_tflops_per_gpu"])


def _parts_by_generation() -> dict[str, tuple[str, ...]]:
    """Bundled accelerator profiles grouped by their ``arch`` (the profile is the one place a part's
    generation is written; a new profile joins its generation's fit by saying so)."""
    out: dict[str, list[str]] = {}
    for name in bundled_hardware():
        hw = load_hardware(name)
        if hw.vendor in ("nvidia", "amd"):
            out.setdefault(hw.arch, []).append(name)
    return {g: tuple(sorted(v)) for g, v in sorted(out.items())}


GENERATIONS = _parts_by_generation()
"""Generation (profile ``arch``) -> bundled parts."""
HOST_GROUPS = {v: tuple(g for g, parts in GENERATIONS.items() if load_hardware(parts[0]).vendor == v)
               for v in ("nvidia", "amd")}
"""Vendor software stack -> generations (the host issue cost belongs to the stack, not the chip)."""
_FAMILY_GENERATIONS = {"nvidia-hopper": ("hopper",), "nvidia-ampere": ("ampere",),
                       "nvidia-blackwell": ("blackwell", "blackwell-ultra"), "amd-instinct": ("cdna3", "cdna4")}
FAMILIES = {fam: tuple(p for g in gens for p in GENERATIONS.get(g, ())) for fam, gens in _FAMILY_GENERATIONS.items()}
"""Per-family fit (without --joint): generations that share a software stack and kernel libraries."""
MANY_ROWS = 8


def family_of(profile: str) -> str:
    for fam, members in FAMILIES.items():
        if profile in members:
            return fam
    return profile


def _fit_run(row: dict, base: Path | None = None, adjust=None, quiet: bool = False):
    """The row's run if a fit may learn from it, else None: it must project, and when defaults fill
    unpublished settings it must fit in memory as published (otherwise it is not what ran, e.g. an
    unstated recompute, and its throughput would teach the fit the wrong thing)."""
    run, assumed, skip = row_to_run(row, base)
    if skip:
        return None
    if "confidence=low" in (row.get("recipe_source") or ""):
        # no commit of the row's release reproduces its printed layout: its recipe is not what ran
        if not quiet:
            print(f"   (excluded {row['id']}: its recipe was read from code that does not reproduce the printed row)")
        return None
    if adjust is not None:
        run = adjust(run)
    if assumed and not project(run).fits:
        if not quiet:
            print(f"   (excluded {row['id']}: assumed defaults for {','.join(assumed)} do not fit in memory)")
        return None
    guessed = [a for a in assumed if any(g in a for g in GUESSES)]
    if guessed:  # validate projects it with a guessed memory or token-drop setting; the fit learns only from what ran
        if not quiet:
            print(f"   (excluded {row['id']}: projected with an unpublished setting validate chose ({guessed[0]}))")
        return None
    return run


def fit_family(family: str, rows: list[dict], *, quiet: bool = False, adjust=None) -> dict:
    runs = []
    for row in rows:
        run = _fit_run(row, adjust=adjust, quiet=quiet)
        if run is None:
            continue
        q, meas = _measured(row)
        runs.append((row["id"], run, q, meas))
    if not runs:
        return {}
    profiles = sorted({r.cluster.hardware.name for _, r, _, _ in runs})
    precisions = sorted({("gemm_fp8" if r.training.precision == "fp8" else "gemm_bf16") for _, r, _, _ in runs})
    seqs = {r.training.seq_len for _, r, _, _ in runs}
    if len(runs) >= MANY_ROWS:
        names = precisions + (["attention"] if max(seqs) >= 4 * min(seqs) else [])
    else:
        names = ["gemm"]
    x0 = np.zeros(len(names))  # log multipliers

    def eff_for(hw, x):
        e = hw.efficiency
        d = {}
        for n, v in zip(names, x):
            if n == "attention":
                d["attention_fwd"] = e.attention_fwd * math.exp(v)
                d["attention_bwd"] = e.attention_bwd * math.exp(v)
            elif n == "gemm":
                d["gemm_bf16"] = e.gemm_bf16 * math.exp(v)
                d["gemm_fp8"] = e.gemm_fp8 * math.exp(v)
            else:
                d[n] = getattr(e, n) * math.exp(v)
        return d

    def resid(x):
        out = []
        for _, run, q, meas in runs:
            p = project(_with_eff(run, **eff_for(run.cluster.hardware, x)))
            val = p.tokens_per_s_per_gpu if q == "tokens" else p.tflops_per_gpu
            out.append(math.log(val / meas))
        return np.array(out)

    before = resid(x0)
    sol = least_squares(resid, x0, bounds=(-1.5, 1.0), diff_step=1e-3)
    after = resid(sol.x)
    fields = {name: eff_for(load_hardware(name), sol.x) for name in profiles}
    return {"family": family, "params": dict(zip(names, np.exp(sol.x))), "fields": fields,
            "rows": [r[0] for r in runs], "before": before, "after": after}


def batch_contrasts(rows: list[dict]) -> list[tuple[dict, dict]]:
    """The CSV's batch contrasts (oracle.validate.batch_contrasts) between MoE rows that both fit in
    memory as published (else they are not what ran), as (larger-mbs row, smaller-mbs row)."""
    by_id = {r["id"]: r for r in rows}
    out = []
    for c in _batch_contrasts(validate_rows(rows)):
        a, b = by_id[c["a"]], by_id[c["b"]]
        if c["fits"] and row_to_run(a)[0].model.is_moe:
            out.append((a, b))
    return out


def fit_stall(pairs: list[tuple[dict, dict]], adjust=None) -> dict:
    """Least squares of log(projected ratio / measured ratio) over ``pairs`` in moe_sync_stall_s."""
    runs = []
    for a, b in pairs:
        ra, rb = (row_to_run(r)[0] for r in (a, b))
        if adjust is not None:
            ra, rb = adjust(ra), adjust(rb)
        runs.append((a["id"], b["id"], ra, rb, math.log(_measured(a)[1] / _measured(b)[1])))

    def resid(x):
        out = []
        for _, _, ra, rb, lm in runs:
            pa = project(_with_eff(ra, moe_sync_stall_s=float(x[0]))).tokens_per_s_per_gpu
            pb = project(_with_eff(rb, moe_sync_stall_s=float(x[0]))).tokens_per_s_per_gpu
            out.append(math.log(pa / pb) - lm)
        return np.array(out)

    x0 = np.array([runs[0][2].cluster.hardware.efficiency.moe_sync_stall_s])
    before = resid(x0)
    sol = least_squares(resid, x0, bounds=(0.0, 0.05), diff_step=1e-2)
    return {"stall_s": float(sol.x[0]), "pairs": [(r[0], r[1], math.exp(r[4]) - 1) for r in runs],
            "before": before, "after": resid(sol.x)}


def _adjuster(stall_s: float | None, gemm_mult: float):
    """Run -> run with the family's GEMM efficiencies x ``gemm_mult`` and the stall set (when given)."""
    def adjust(run):
        e = run.cluster.hardware.efficiency
        eff = {"gemm_bf16": e.gemm_bf16 * gemm_mult, "gemm_fp8": e.gemm_fp8 * gemm_mult}
        if stall_s is not None:
            eff["moe_sync_stall_s"] = stall_s
        return _with_eff(run, **eff)
    return adjust


def contrast_cycle(family: str, fam_rows: list[dict], all_rows: list[dict], rounds: int = 3,
                   loo: bool = False) -> None:
    """Alternate the stall fit (batch contrasts, any quality) and the GEMM multiplier fit (A/B rows)."""
    members = FAMILIES.get(family, (family,))
    pairs = batch_contrasts([r for r in all_rows if r["hardware"].strip() in members])
    if not pairs:
        print(f"== family {family}: no batch contrasts in the CSV")
        return
    print(f"== family {family}: moe_sync_stall_s fitted on {len(pairs)} batch contrasts and the GEMM "
          f"multiplier on the family's rows above, alternately")
    mult, stall = 1.0, None
    for k in range(rounds):
        st = fit_stall(pairs, _adjuster(None, mult))
        stall = st["stall_s"]
        res = fit_family(family, fam_rows, quiet=True, adjust=_adjuster(stall, mult))
        if "gemm" not in res.get("params", {}):  # a many-row family fits per precision: stall only
            print(f"   (family {family} fits per-precision multipliers; only the stall is fitted here)")
            break
        mult *= res["params"]["gemm"]
        print(f"   round {k + 1}: moe_sync_stall_s = {1e3 * stall:.2f} ms; GEMM multiplier on the YAML values x{mult:.3f}")
    st = fit_stall(pairs, _adjuster(None, mult))
    for (a, b, meas), r in zip(st["pairs"], st["after"]):
        proj = (1 + meas) * math.exp(r) - 1
        print(f"   {a} / {b}: measured {100 * meas:+.1f}%  projected {100 * proj:+.1f}%")
    if loo and len(pairs) > 1:
        for i, held in enumerate(pairs):
            rest = fit_stall(pairs[:i] + pairs[i + 1:], _adjuster(None, mult))
            one = fit_stall([held], _adjuster(rest["stall_s"], mult))  # evaluated at the others' stall
            _, _, meas = one["pairs"][0]
            proj = (1 + meas) * math.exp(one["before"][0]) - 1
            print(f"   leave-one-contrast-out {held[0]['id']} / {held[1]['id']}: stall from the others "
                  f"{1e3 * rest['stall_s']:.2f} ms predicts {100 * proj:+.1f}% (measured {100 * meas:+.1f}%)")
    res = fit_family(family, fam_rows, quiet=True, adjust=_adjuster(st["stall_s"], mult))
    for rid, a in zip(res["rows"], res["after"]):
        print(f"   {rid:24s} after {100 * (math.exp(a) - 1):+6.1f}%")
    for prof in members:
        e = load_hardware(prof).efficiency
        print(f"   {prof}: gemm_bf16={e.gemm_bf16 * mult:.3f}, gemm_fp8={e.gemm_fp8 * mult:.3f}, "
              f"moe_sync_stall_s={st['stall_s']:.4f}")


# ------------------------------------------------------------------ per-generation joint fit
def family_kind(card) -> str:
    """A model's family for leave-one-family-out: dense; coarse MoE (a few large experts, e.g. 8 top-2); or
    fine-grained MoE (>= 32 small experts, e.g. Qwen3 128 top-8, DeepSeek-V3 256 top-8)."""
    if not card.is_moe:
        return "dense"
    return "fine-grained-moe" if card.num_experts >= 32 else "coarse-moe"


def generation_of(profile: str) -> str:
    return next((g for g, members in GENERATIONS.items() if profile in members), profile)


class FitRow(NamedTuple):
    id: str
    model: str
    part: str
    run: object
    quantity: str
    measured: float
    source: str
    quality: str = ""
    """The row's quality (A: a published table with the full layout; B: some of it inferred)."""


_JOINT_TAG = "fit: benchmarks/calibrate.py --joint"
_PRIOR = re.compile(r"; prior ([0-9.eE+-]+) \((.*)\)$")


def priors(hw) -> dict[str, tuple[float, str]]:
    """Each efficiency field's sourced prior: the value and source in the YAML, or, for a field an earlier
    ``--joint --write`` set, the prior it recorded (so rerunning the fit starts from the same priors)."""
    out = {}
    for f in dataclasses.fields(hw.efficiency):
        v, src = getattr(hw.efficiency, f.name), hw.efficiency_sources.get(f.name, "")
        m = _PRIOR.search(src) if src.startswith(_JOINT_TAG) else None
        out[f.name] = (float(m.group(1)), m.group(2)) if m else (v, src)
    return out


def _at_priors(run):
    return _with_eff(run, **{k: v for k, (v, _) in priors(run.cluster.hardware).items()})


def _model_key(cell: str) -> str:
    """A row's model as the CSV names it (a card path by its file name)."""
    cell = cell.strip()
    return Path(cell).name.rsplit(".", 1)[0] if cell.endswith((".yaml", ".yml")) else cell


def joint_rows(paths: list[str], quals: set[str], quiet: bool = False) -> list[FitRow]:
    """Newest-release, quality-filtered rows of every CSV that project and fit in memory as published."""
    out = []
    for path in paths:
        rows = read_rows(path)
        base = Path(path).parent
        for row, newest in zip(rows, newest_flags(rows)):
            if not newest or (row.get("quality") or "") not in quals:
                continue
            run = _fit_run(row, base, quiet=quiet)
            if run is None:
                continue
            q, meas = _measured(row)
            # the CSV's model, not the run's card name: a published variant (w/o MTP) is the same model
            out.append(FitRow(row["id"], _model_key(row["model"]), run.cluster.hardware.name, _at_priors(run), q, meas,
                              Path(path).name, (row.get("quality") or "").strip()))
    return out


# Prior spread of each fitted log-multiplier: the fit is a MAP estimate, so a parameter the rows barely
# constrain (GEMM vs attention share on two sequence lengths, host cost on one MoE row) stays near its
# sourced prior instead of running to a bound. One sd = x1.35 on GEMM, x1.65 on attention, x7 on host.
PRIOR_SD = {"gemm": 0.3, "attention": 0.5, "host_op_s": 2.0, "gemm_fp4": 0.3, "gemm_mxfp8": 0.1, "gemm_grouped": 0.3,
            "moe_sync_stall_s": 2.0, "grouped_gemm_overhead_s": 1.0, "gemm_k_half": 1.0, "alltoall_share": 0.5}
"""... and x1.1 on MXFP8 beyond the generation's GEMM multiplier: the same tensor cores at the same peak, so a
recipe's own cost is expected within ~10% (NVIDIA's same-layout pairs measure 2-6%)."""
ROW_SD = 0.10
"""Spread of log(projected/measured) a row keeps whatever the constants (unpublished settings, software)."""
MIN_MOE_ROWS_FOR_HOST = 3


# The host issue cost per framework op belongs to the host CPU and the framework's MoE path, not to the
# GPU: one multiplier per vendor's software stack, fitted jointly over its generations' MoE rows.
def host_group_of(gen: str) -> str:
    return next((g for g, members in HOST_GROUPS.items() if gen in members), gen)


def _gen_params(rows: list[FitRow]) -> list[str]:
    """The per-generation parameters its rows can constrain (the host cost is shared: fit_all)."""
    names = ["gemm"]
    if len(rows) >= 6 and len({r.run.training.seq_len for r in rows}) > 1:
        names.append("attention")
    if any(r.run.training.precision == "nvfp4" for r in rows):
        names.append("gemm_fp4")
    if any(r.run.training.gemm_kernel == "mxfp8" for r in rows):
        names.append("gemm_mxfp8")
    if sum(1 for r in rows if r.run.model.is_moe) >= MIN_MOE_ROWS_FOR_HOST:
        names += FIT_GROUPED
    if sum(1 for r in rows if _library_a2a(r)) >= MIN_MOE_ROWS_FOR_HOST:
        names.append("alltoall_share")
    return names


def _library_a2a(r: FitRow) -> bool:
    """The row's EP all-to-all is the collective library's (NCCL/RCCL), what ``alltoall_share`` prices."""
    t = r.run.training
    return r.run.model.is_moe and t.ep > 1 and t.moe_a2a_backend == "alltoall"


FIT_GROUPED: tuple[str, ...] = ("gemm_grouped", "grouped_gemm_overhead_s")
"""What the fit learns of grouped GEMMs beyond the dense kernel model, per generation over its MoE rows: their
fraction of the dense kernels' efficiency and the per-batch kernel overhead. (Fitting the short-reduction
constant gemm_k_half instead of the fraction was tried: leave-one-model-out 10.6% against 10.1%, and a K_half of
~1,800 on Blackwell; docs/accuracy.md.)"""


STACK_PARAMS = ("host_op_s", "moe_sync_stall_s")
"""Parameters of a vendor's host software stack, one multiplier per stack (the host CPU and the framework's
MoE path, not the GPU): the issue time per framework op, and the device idle per dispatcher sync."""


def log_bounds(name: str) -> tuple[float, float]:
    """Bounds of a fitted log-multiplier: an efficiency (a fraction of peak) moves x0.22..x2.7; a per-kernel
    overhead or the short-reduction constant x0.05..x20; a host-stack cost x0.007..x150, since the priors are
    single-op microbenchmarks (an eager op's issue time, one stream sync) and what a framework's MoE path pays
    per op and per sync (Python per module, the cross-rank wait behind a count exchange) is not one op."""
    if name in STACK_PARAMS:
        return -5.0, 5.0
    if name in ("grouped_gemm_overhead_s", "gemm_k_half"):
        return -3.0, 3.0
    return -1.5, 1.0


def _stack_value(hw, name: str, x: float) -> str:
    """A fitted host-stack parameter (seconds) in us."""
    return f"{_gen_eff(hw, [name], [x])[name] * 1e6:.1f} us"


def _synced_moe(r: FitRow) -> bool:
    return r.run.model.is_moe and r.run.training.ep > 1 and r.run.training.moe_host_sync


def _gen_eff(hw, names, x) -> dict:
    e = hw.efficiency
    d = {}
    for n, v in zip(names, x):
        if n == "gemm":  # the generation's GEMM multiplier moves every GEMM kernel class it runs
            d["gemm_bf16"] = min(1.0, e.gemm_bf16 * math.exp(v))
            d["gemm_fp8"] = min(1.0, e.gemm_fp8 * math.exp(v))
            if e.gemm_mxfp8 > 0:
                d["gemm_mxfp8"] = min(1.0, d.get("gemm_mxfp8", e.gemm_mxfp8) * math.exp(v))
        elif n == "attention":
            d["attention_fwd"] = min(1.0, e.attention_fwd * math.exp(v))
            d["attention_bwd"] = min(1.0, e.attention_bwd * math.exp(v))
        elif n == "host_op_s":
            d["host_op_s"] = e.host_op_s * math.exp(v)
        elif n == "moe_sync_stall_s":
            d["moe_sync_stall_s"] = e.moe_sync_stall_s * math.exp(v)
        elif n == "gemm_k_half":
            d["gemm_k_half"] = e.gemm_k_half * math.exp(v)
        elif n == "grouped_gemm_overhead_s":
            d["grouped_gemm_overhead_s"] = e.grouped_gemm_overhead_s * math.exp(v)
        elif n == "gemm_grouped":
            d["gemm_grouped"] = min(1.0 / max(e.gemm_bf16, e.gemm_fp8, 1e-9), e.gemm_grouped * math.exp(v))
        elif n == "gemm_fp4":
            d["gemm_fp4"] = min(1.0, e.gemm_fp4 * math.exp(v))
        elif n == "alltoall_share":
            d["alltoall_share"] = min(1.0 / e.scale_up_bus, e.alltoall_share * math.exp(v))  # at most the link rate
        elif n == "gemm_mxfp8":  # the MXFP8 recipe's own cost, on top of the GEMM multiplier
            d["gemm_mxfp8"] = min(1.0, d.get("gemm_mxfp8", e.gemm_mxfp8) * math.exp(v))
    return d


def _resid(rows: list[FitRow], names, x) -> np.ndarray:
    out = []
    for r in rows:
        p = project(_with_eff(r.run, **_gen_eff(r.run.cluster.hardware, names, x)))
        val = p.tokens_per_s_per_gpu if r.quantity == "tokens" else p.tflops_per_gpu
        out.append(math.log(val / r.measured))
    return np.array(out)


def _robust(z: np.ndarray) -> np.ndarray:
    """Soft-L1 rows: sign(z) sqrt(2 (sqrt(1 + z^2) - 1)), quadratic within one ROW_SD, linear beyond."""
    return np.sign(z) * np.sqrt(2.0 * (np.sqrt(1.0 + z * z) - 1.0))


def fit_all(rows: list[FitRow]) -> dict[str, dict]:
    """MAP least squares in log space over every generation at once: per generation its GEMM / attention
    / FP4 multipliers, per vendor stack one host-cost multiplier (when it has >= MIN_MOE_ROWS_FOR_HOST
    MoE rows). Returns per generation {"names", "x", "before", "after"}; a generation of a vendor whose
    host cost was fitted but with no rows of its own gets that host cost alone ("names" ["host_op_s"])."""
    gens = sorted({generation_of(r.part) for r in rows})
    by_gen = {g: [r for r in rows if generation_of(r.part) == g] for g in gens}
    cols: list[tuple[str, str]] = [(g, n) for g in gens for n in _gen_params(by_gen[g])]
    for grp, members in HOST_GROUPS.items():
        if sum(1 for r in rows if generation_of(r.part) in members and r.run.model.is_moe) >= MIN_MOE_ROWS_FOR_HOST:
            cols.append((grp, "host_op_s"))
        if sum(1 for r in rows if generation_of(r.part) in members and _synced_moe(r)) >= MIN_MOE_ROWS_FOR_HOST:
            cols.append((grp, "moe_sync_stall_s"))

    def gen_cols(g: str) -> list[int]:
        return [i for i, (o, n) in enumerate(cols) if o == g or (n in STACK_PARAMS and o == host_group_of(g))]

    order = [r for g in gens for r in by_gen[g]]
    sparsity = np.zeros((len(order) + len(cols), len(cols)), dtype=int)
    at = 0
    for g in gens:
        for i in gen_cols(g):
            sparsity[at:at + len(by_gen[g]), i] = 1
        at += len(by_gen[g])
    sparsity[len(order):, :] = np.eye(len(cols), dtype=int)

    def resid(x: np.ndarray) -> np.ndarray:
        return np.concatenate([_resid(by_gen[g], [cols[i][1] for i in gen_cols(g)], x[gen_cols(g)]) for g in gens])

    x0 = np.zeros(len(cols))
    host_cols = [i for i, (_, n) in enumerate(cols) if n in STACK_PARAMS]
    for i in host_cols:
        # max(device, host) is flat in host_op_s wherever the host does not bind: start from the best
        # of a few host costs (0.5x .. 8x the prior) so the gradient sees the host-bound rows
        starts = []
        for lg in np.log([0.5, 1.0, 2.0, 4.0, 8.0]):
            x = x0.copy()
            x[i] = lg
            starts.append((float(np.sum(resid(x) ** 2)), x))
        x0 = min(starts, key=lambda t: t[0])[1]
    lo = [log_bounds(n)[0] for _, n in cols]
    hi = [log_bounds(n)[1] for _, n in cols]
    sd = np.array([PRIOR_SD[n] for _, n in cols])
    sol = least_squares(lambda x: np.concatenate([_robust(resid(x) / ROW_SD), x / sd]), x0, bounds=(lo, hi),
                        diff_step=1e-3, jac_sparsity=sparsity)
    out = {}
    for g in gens:
        idx = gen_cols(g)
        names = [cols[i][1] for i in idx]
        out[g] = {"names": names, "x": sol.x[idx], "before": _resid(by_gen[g], names, np.zeros(len(idx))),
                  "after": _resid(by_gen[g], names, sol.x[idx])}
    for i in host_cols:  # the vendor's other generations take its host costs
        for g in HOST_GROUPS[cols[i][0]]:
            fit = out.setdefault(g, {"names": [], "x": np.array([]), "before": np.array([]), "after": np.array([])})
            if cols[i][1] not in fit["names"]:
                fit["names"] = [*fit["names"], cols[i][1]]
                fit["x"] = np.append(fit["x"], sol.x[i])
    return out


def _project_with(fit: dict | None, r: FitRow) -> float:
    eff = _gen_eff(r.run.cluster.hardware, fit["names"], fit["x"]) if fit else {}
    p = project(_with_eff(r.run, **eff))
    val = p.tokens_per_s_per_gpu if r.quantity == "tokens" else p.tflops_per_gpu
    return val / r.measured - 1.0


def _pct(xs) -> str:
    xs = [abs(x) for x in xs]
    return f"median {100 * statistics.median(xs):.1f}%  max {100 * max(xs):.1f}%  n={len(xs)}" if xs else "n=0"


def _held_out(rows: list[FitRow], key) -> dict[str, list[float]]:
    """Errors of each group of rows (by ``key``) projected by per-generation fits that never saw it."""
    out: dict[str, list[float]] = {}
    for k in sorted({key(r) for r in rows}):
        fits = fit_all([r for r in rows if key(r) != k])
        # a generation with no other rows keeps its priors (and its vendor's fitted host cost)
        out[k] = [_project_with(fits.get(generation_of(r.part)), r) for r in rows if key(r) == k]
    return out


def _at_priors_hw(hw):
    return dataclasses.replace(hw, efficiency=dataclasses.replace(
        hw.efficiency, **{k: v for k, (v, _) in priors(hw).items()}))


def write_profiles(fits: dict[str, dict], rows: list[FitRow], paths: list[str]) -> None:
    """Put the fitted values into each member profile's YAML (value + a source naming the fit)."""
    from hardware import PROFILE_DIR
    files = ", ".join(Path(p).name for p in paths)
    for gen, fit in fits.items():
        ids = [r.id for r in rows if generation_of(r.part) == gen]
        for part in GENERATIONS[gen]:
            loaded = load_hardware(part)
            prior = priors(loaded)
            eff = _gen_eff(_at_priors_hw(loaded), fit["names"], fit["x"])
            path = Path(PROFILE_DIR) / f"{part}.yaml"
            text = path.read_text()
            # a field an earlier fit set but this one does not fit (e.g. host_op_s once its generation has
            # too few MoE rows) goes back to its recorded prior, value and source
            back = {k: v for k, (v, _) in prior.items()
                    if k not in eff and loaded.efficiency_sources.get(k, "").startswith(_JOINT_TAG)}
            for field_name, value in {**eff, **back}.items():
                p_val, p_src = prior[field_name]
                if field_name in STACK_PARAMS and field_name in eff:  # one multiplier per vendor stack
                    grp = host_group_of(gen)
                    moe = [r.id for r in rows if host_group_of(generation_of(r.part)) == grp and r.run.model.is_moe
                           and (field_name == "host_op_s" or _synced_moe(r))]
                    over = (f"the {grp} host stack (one multiplier shared by {', '.join(HOST_GROUPS[grp])}) over "
                            f"{len(moe)} MoE rows ({', '.join(moe[:3])}{', ...' if len(moe) > 3 else ''}")
                else:
                    over = (f"generation {gen} over {len(ids)} newest-release A/B rows "
                            f"({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''}")
                src = (f"{_JOINT_TAG} {files}, x{value / max(p_val, 1e-30):.3f} on the prior, {over}; "
                       f"docs/accuracy.md); prior {p_val:.4g} ({p_src.replace(chr(34), chr(39))})"
                       if field_name in eff else p_src.replace(chr(34), chr(39)))
                fmt = f"{value:.3e}" if field_name.endswith("_s") else f"{value:.3f}"
                line = f'  {field_name}: {{value: {fmt}, source: "{src}"}}'
                text, n = re.subn(rf"^  {field_name}: \{{value: [^,]+, source: .*$", line.replace("\\", "\\\\"), text,
                                  flags=re.M)
                if n != 1:
                    raise SystemExit(f"{path}: could not find the efficiency line of {field_name}")
            path.write_text(text)
            print(f"   wrote {path.name}: " + ", ".join(f"{k}={v:.4g}" for k, v in eff.items())
                  + "".join(f", {k}={v:.4g} (back to its prior)" for k, v in back.items()))


def joint(paths: list[str], quals: set[str], write: bool, held_out: bool) -> int:
    rows = joint_rows(paths, quals)
    fits = fit_all(rows)
    for gen in GENERATIONS:
        rs = [r for r in rows if generation_of(r.part) == gen]
        if not rs:
            shared = f" except the {host_group_of(gen)} host cost" if gen in fits else ""
            print(f"== generation {gen}: no rows; its profiles keep their sourced priors{shared}")
            continue
        fit = fits[gen]
        params = ", ".join(f"{n} {_stack_value(rs[0].run.cluster.hardware, n, v)}" if n in STACK_PARAMS
                           else f"{n} x{math.exp(v):.3f}" for n, v in zip(fit["names"], fit["x"]))
        print(f"== generation {gen}: {len(rs)} rows, models {', '.join(sorted({r.model for r in rs}))}; {params}")
        for r, b, a in zip(rs, fit["before"], fit["after"]):
            print(f"   {r.id:48s} before {100 * (math.exp(b) - 1):+6.1f}%   after {100 * (math.exp(a) - 1):+6.1f}%")
        print(f"   before: {_pct([math.exp(b) - 1 for b in fit['before']])}   after: "
              f"{_pct([math.exp(a) - 1 for a in fit['after']])}")
    if held_out:
        for label, key in (("model", lambda r: r.model), ("family", lambda r: family_kind(r.run.model)),
                           ("part", lambda r: r.part)):
            errs = _held_out(rows, key)
            print(f"== leave-one-{label}-out (each {label} projected by per-generation fits that never saw it)")
            for k, es in errs.items():
                print(f"   {k:20s} {_pct(es)}")
            allv = [e for es in errs.values() for e in es]
            print(f"   all rows: {_pct(allv)};  median over {label}s of the per-{label} median: "
                  f"{100 * statistics.median(statistics.median(abs(e) for e in es) for es in errs.values()):.1f}%")
            # the same held-out errors on the quality-A rows alone (B rows, partly inferred, are fitted on, not targets)
            a_errs = {k: [e for r, e in zip([r for r in rows if key(r) == k], es) if r.quality == "A"]
                      for k, es in errs.items()}
            a_errs = {k: es for k, es in a_errs.items() if es}
            if a_errs:
                worst = max(a_errs, key=lambda k: statistics.median(abs(e) for e in a_errs[k]))
                print(f"   quality-A rows: {_pct([e for es in a_errs.values() for e in es])};  worst {label} "
                      f"{worst} {100 * statistics.median(abs(e) for e in a_errs[worst]):.1f}% (median of its A rows); "
                      f"{label}s with no A row: {', '.join(sorted(set(errs) - set(a_errs))) or 'none'}")
            if label != "part":  # the same held-out errors, per GPU generation
                flat = {r.id: e for k, es in errs.items() for r, e in zip([r for r in rows if key(r) == k], es)}
                for gen in GENERATIONS:
                    rs = [r for r in rows if generation_of(r.part) == gen]
                    if rs:
                        print(f"   generation {gen:16s} {_pct([flat[r.id] for r in rs])}  by {label}: " + ", ".join(
                            f"{k} {100 * statistics.median(abs(flat[r.id]) for r in rs if key(r) == k):.1f}%"
                            for k in sorted({key(r) for r in rs})))
    if write:
        write_profiles(fits, rows, paths)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--quality", default="A,B")
    ap.add_argument("--hardware", default=None)
    ap.add_argument("--loo", action="store_true", help="also report leave-one-out errors: each row "
                    "predicted by a fit that never saw it")
    ap.add_argument("--contrasts", action="store_true", help="also fit efficiency.moe_sync_stall_s on the "
                    "batch contrasts of each sweep, alternating with the GEMM multiplier")
    ap.add_argument("--joint", action="store_true", help="per-GPU-generation fit over every CSV given (newest "
                    "release of each configuration), with leave-one-model-out / leave-one-part-out errors")
    ap.add_argument("--no-held-out", action="store_true", help="with --joint: skip the leave-one-out refits")
    ap.add_argument("--write", action="store_true", help="with --joint: write the fitted values into the profiles")
    args = ap.parse_args()
    quals = set(args.quality.split(","))
    if args.joint:
        return joint(args.csv, quals, args.write, not args.no_held_out)
    if len(args.csv) > 1:
        ap.error("several CSVs need --joint")
    args.csv = args.csv[0]
    all_rows = read_rows(args.csv)
    rows = [r for r in all_rows if (r.get("quality") or "") in quals]
    by_fam: dict[str, list] = {}
    for r in rows:
        if args.hardware and r["hardware"].strip() != args.hardware:
            continue
        by_fam.setdefault(family_of(r["hardware"].strip()), []).append(r)
    for fam, rs in sorted(by_fam.items()):
        res = fit_family(fam, rs)
        if not res:
            continue
        print(f"== family {fam}: {len(res['rows'])} rows ({args.quality}); multipliers "
              + ", ".join(f"{k} x{v:.3f}" for k, v in res["params"].items()))
        for prof, fields in res["fields"].items():
            print(f"   {prof}: " + ", ".join(f"{k}={v:.3f}" for k, v in fields.items()))
        for rid, b, a in zip(res["rows"], res["before"], res["after"]):
            print(f"   {rid:24s} before {100 * (math.exp(b) - 1):+6.1f}%   after {100 * (math.exp(a) - 1):+6.1f}%")
        med_b = statistics.median(abs(math.exp(b) - 1) for b in res["before"])
        med_a = statistics.median(abs(math.exp(a) - 1) for a in res["after"])
        print(f"   median |error| before {100 * med_b:.1f}%  after {100 * med_a:.1f}%")
        if args.loo and len(res["rows"]) > 2:
            loo = []
            for rid in res["rows"]:
                held = next(r for r in rs if r["id"] == rid)
                fit = fit_family(fam, [r for r in rs if r["id"] != rid], quiet=True)
                run, _, _ = row_to_run(held)
                eff = next(iter(fit["fields"].values())) if len(fit["fields"]) == 1 else fit["fields"][run.cluster.hardware.name]
                q, meas = _measured(held)
                p = project(_with_eff(run, **eff))
                val = p.tokens_per_s_per_gpu if q == "tokens" else p.tflops_per_gpu
                loo.append(val / meas - 1)
                print(f"   leave-one-out {rid:24s} {100 * loo[-1]:+6.1f}%")
            print(f"   leave-one-out median |error| {100 * statistics.median(abs(x) for x in loo):.1f}%  "
                  f"max {100 * max(abs(x) for x in loo):.1f}%")
        if args.contrasts:
            contrast_cycle(fam, rs, all_rows, loo=args.loo)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
