"""Legality checks of a RunConfig: every problem found, one line each, naming the values."""
from __future__ import annotations

from typing import TYPE_CHECKING

from oracle.cuda_graphs import full_iteration
from oracle.errors import InvalidConfigError, clip
from oracle.layout import Layout
from oracle.model_card import MOE_KINDS
from oracle.opgraph import RECOMPUTE_MODULES
from oracle.pipeline.schedules import SCHEDULES, get_schedule

if TYPE_CHECKING:  # annotations only: oracle.config calls check() (no import cycle)
    from collections.abc import Callable

    from oracle.config import RunConfig, TrainingConfig
    from oracle.model_card import ModelCard


def _divides(a: int, b: int) -> bool:
    return a > 0 and b % a == 0


MAX_STAGES_PER_LAYER = 64
"""pp*vpp above this many times (layers + embedding + loss) is refused before any layout is built."""
MAX_BATCH = {"seq_len": 2**30, "gbs": 2**30, "mbs": 2**30}
"""Largest accepted sequence length (tokens; the model cards' max_seq_len bound) and batch sizes (sequences)."""
MAX_MICROBATCHES = 65_536
"""Micro-batches per iteration the pipeline simulator accepts (~0.4 ms each on a 2-core CPU: ~30 s at
the limit); published recipes use at most a few thousand."""


def check(run: RunConfig) -> list[str]:
    """Return the list of reasons ``run`` cannot be trained as configured (empty = legal)."""
    t, m, n = run.training, run.model, run.cluster.num_gpus
    hw = run.cluster.hardware
    p: list[str] = []
    for k in ("seq_len", "gbs", "mbs", "tp", "pp", "vpp", "cp", "ep", "etp"):
        if getattr(t, k) < 1:
            p.append(f"training.{k}={getattr(t, k)} must be >= 1")
    if p:
        return p
    # absurd sizes end here, before a layout lists every virtual stage (a fuzzed vpp of 1e16 ran out of memory)
    # or a projection overflows a float (a seq_len of 10**400)
    big = [f"training.{k}={clip(f'{getattr(t, k):,}', 60)} is absurd: at most {limit:,}"
           for k, limit in MAX_BATCH.items() if getattr(t, k) > limit]
    if big:
        return big
    if t.pp > n or t.pp * t.vpp > MAX_STAGES_PER_LAYER * (m.num_layers + m.mtp_layers + 2):
        return [f"pp*vpp = {t.pp}*{t.vpp} pipeline stages cannot be laid out: {n} GPUs, {m.num_layers} layers "
                f"of {m.name}"]
    mp = t.tp * t.pp * t.cp
    if n % mp == 0 and t.gbs // (t.mbs * (n // mp)) > MAX_MICROBATCHES:  # the simulator walks each one
        return [f"gbs/(mbs*dp) = {t.gbs}/({t.mbs}*{n // mp}) = {t.gbs // (t.mbs * (n // mp)):,} micro-batches per "
                f"iteration: at most {MAX_MICROBATCHES:,} are simulated (raise mbs or lower gbs)"]
    if t.moe_imbalance < 1.0:
        p.append(f"training.moe_imbalance={t.moe_imbalance} must be >= 1.0 (busiest-rank / mean load)")
    model_par = t.tp * t.pp * t.cp
    if n % model_par:
        p.append(f"tp*pp*cp = {t.tp}*{t.pp}*{t.cp} = {model_par} does not divide {n} GPUs")
    dp = n // model_par if n % model_par == 0 else None
    # attention heads
    if m.num_attention_heads % t.tp:
        p.append(f"num_attention_heads={m.num_attention_heads} of {m.name} is not divisible by tp={t.tp}")
    if m.attention == "gqa" and m.kv_heads % t.tp and t.tp % m.kv_heads:
        p.append(f"num_query_groups={m.kv_heads} of {m.name} and tp={t.tp}: one must divide the other")
    # pipeline layer assignment: even, or Megatron's uneven layout keys (oracle.pipeline_layout); a
    # split that does not tile names the values and suggests keys that would
    lay = Layout(run)
    try:
        lay.assignment  # noqa: B018 - resolves (and caches) the layout or raises naming the values
    except InvalidConfigError as exc:
        p += exc.problems
        lay = None
    # schedule: the registered spec's own rules (VPP rule, least micro-batches), as the projector applies them
    sched = t.schedule
    if sched not in SCHEDULES:
        p.append(f"training.pp_schedule={sched!r} is not one of auto | {' | '.join(SCHEDULES)}")
    elif t.pp == 1:
        if t.vpp > 1:
            p.append(f"vpp={t.vpp} needs pp > 1")
        if sched != "1f1b" and t.pp_schedule != "auto":
            p.append(f"pp_schedule={sched} needs pp > 1 (pp=1 has no pipeline); use auto or 1f1b")
    else:
        num_mb = t.gbs // (t.mbs * dp) if dp and t.gbs % (t.mbs * dp) == 0 else None
        p += get_schedule(sched).problems(t.pp, t.vpp, num_mb)
    # MoE
    if m.is_moe:
        if m.num_experts % t.ep:
            p.append(f"num_experts={m.num_experts} of {m.name} is not divisible by ep={t.ep}")
        exp_par = t.pp * t.ep * t.etp
        if n % exp_par:
            p.append(f"pp*ep*etp = {t.pp}*{t.ep}*{t.etp} = {exp_par} does not divide {n} GPUs "
                     f"(expert data parallel must be an integer)")
        if m.expert_ffn % t.etp:
            p.append(f"moe_ffn_hidden_size={m.expert_ffn} is not divisible by etp={t.etp}")
    else:
        if t.ep > 1:
            p.append(f"ep={t.ep} needs a MoE model; {m.name} is dense (use ep=1)")
        if t.etp > 1:
            p.append(f"etp={t.etp} needs a MoE model; {m.name} is dense (use etp=1)")
    # batch
    if dp:
        if t.gbs % (t.mbs * dp):
            p.append(f"gbs={t.gbs} is not divisible by mbs*dp = {t.mbs}*{dp} = {t.mbs * dp}")
    # sequence
    if t.cp > 1 and t.seq_len % (2 * t.cp):
        p.append(f"seq_len={t.seq_len} is not divisible by 2*cp = {2 * t.cp} (load-balanced context parallel)")
    if t.sp and (t.seq_len // t.cp) % t.tp:
        p.append(f"seq_len/cp = {t.seq_len // t.cp} is not divisible by tp={t.tp} (sequence parallel)")
    if t.cp_comm_type != "p2p":
        if t.framework != "megatron":
            p.append(f"cp_comm_type={t.cp_comm_type} is Megatron-Core's; framework={t.framework} rotates K,V its own "
                     f"way: leave it at p2p")
        elif t.cp_comm_type == "a2a" and t.cp > 1:
            # Ulysses: each CP rank takes whole heads of the TP rank's share (query and key/value heads alike)
            heads = {"query": m.num_attention_heads // max(1, t.tp),
                     "key/value": (m.kv_heads if m.attention == "gqa" else m.num_attention_heads) // max(1, t.tp)}
            bad = {k: h for k, h in heads.items() if h % t.cp}
            if bad:
                p.append(f"cp_comm_type=a2a with cp={t.cp}: the all-to-all scatters each TP rank's heads over the CP "
                         f"ranks, and " + ", ".join(f"its {h} {k} heads" for k, h in bad.items())
                         + f" do not split into {t.cp}; use cp_comm_type=p2p or a cp that divides them")
    # recompute
    if t.recompute_num_layers is not None:
        if t.recompute != "full":
            p.append(f"recompute_num_layers={t.recompute_num_layers} only applies with recompute=full, "
                     f"got recompute={t.recompute}")
        elif t.recompute_num_layers < 0:
            p.append(f"recompute_num_layers={t.recompute_num_layers} must be >= 0")
        elif lay is not None and t.recompute_num_layers > (most := max(sum(map(len, c)) for c in lay.stage_layers)
                                                           // m.positions_per_layer):
            p.append(f"recompute_num_layers={t.recompute_num_layers} exceeds the {most} layers "
                     f"of the largest pipeline stage")
    if t.recompute_modules is not None:
        p += _recompute_module_problems(run)
    # precision
    if t.precision == "fp8" and not hw.supports("fp8"):
        p.append(f"precision=fp8 needs FP8 support; hardware {hw.name!r} has "
                 f"{', '.join(sorted(hw.peak_flops_per_s))} only")
    if t.precision == "nvfp4" and not hw.fp4_gemms:
        p.append(f"precision=nvfp4 needs FP4 tensor cores with a gemm_fp4 efficiency in the profile; hardware "
                 f"{hw.name!r} has {', '.join(sorted(hw.peak_flops_per_s))} (use bf16 or fp8)")
    if t.fp8_recipe != "delayed" and t.precision != "fp8":
        p.append(f"fp8_recipe={t.fp8_recipe} scales FP8 GEMM inputs: it needs precision=fp8, got precision={t.precision}")
    elif t.fp8_recipe == "mxfp8" and not hw.mxfp8_gemms:
        p.append(f"fp8_recipe=mxfp8 needs block-scaled FP8 tensor cores with a gemm_mxfp8 efficiency in the profile "
                 f"(Blackwell, CDNA4); hardware {hw.name!r} has none: use fp8_recipe=delayed, tensorwise or blockwise")
    if t.fp8_activations and t.precision != "fp8":
        p.append("fp8_activations=true needs precision=fp8")
    p += _param_gather_problems(run)
    if t.moe_a2a_backend != "alltoall" and not m.is_moe:
        p.append(f"moe_a2a_backend={t.moe_a2a_backend} needs a MoE model; {m.name} is dense")
    if t.moe_a2a_backend == "hybridep" and hw.vendor.lower() != "nvidia":  # DeepEP's hybrid-ep kernels: CUDA, NVLink
        p.append(f"moe_a2a_backend=hybridep is NVIDIA's HybridEP (DeepEP's hybrid-ep kernels over NVLink and the "
                 f"NVLink domain); {hw.name} is {hw.vendor}: use deepep or alltoall")
    if t.moe_sync_free:
        if not m.is_moe:
            p.append(f"moe_sync_free=true needs a MoE model; {m.name} is dense")
        elif t.moe_a2a_backend != "deepep":
            p.append(f"moe_sync_free=true needs moe_a2a_backend=deepep (the sync-free MoE path runs on "
                     f"DeepEP), got moe_a2a_backend={t.moe_a2a_backend}")
        if hw.vendor.lower() != "amd":  # Primus-Turbo is AMD's kernel library (ROCm, Instinct GPUs)
            p.append(f"moe_sync_free=true is Primus-Turbo's sync-free MoE, which runs on AMD Instinct GPUs; "
                     f"{hw.name} is {hw.vendor}: there the MoE block runs without a host sync with HybridEP's static "
                     f"budget and the fused grouped MLP (moe_a2a_backend=hybridep, moe_expert_rank_capacity_factor, "
                     f"fused_grouped_mlp=true)")
    if t.moe_a2a_overlap:
        p += _a2a_overlap_problems(run)
    p += _cuda_graph_problems(run)
    p += _graph_recompute_problems(run)
    p += _capacity_problems(run)
    p += _dispatcher_problems(run)
    p += _precision_feature_problems(run)
    p += _memory_feature_problems(run)
    p += _framework_problems(run)
    if m.is_hybrid:
        p += _hybrid_problems(run)
    p += _latent_moe_problems(run)
    return p


def _latent_moe_problems(run: RunConfig) -> list[str]:
    """Latent MoE: Megatron-Core MoELayer refuses the shared-expert overlap with latent projections in training."""
    t, m = run.training, run.model
    if m.moe_latent_size and t.moe_shared_expert_overlap:
        return [f"moe_shared_expert_overlap=true with the latent MoE of {m.name}: Megatron-Core does not support the "
                f"shared-expert overlap with MoE latent projections in training; use false"]
    return []


def _hybrid_problems(run: RunConfig) -> list[str]:
    """A hybrid model: what Megatron-Core asserts of its layout (MambaMixer, GatedDeltaNet), and what is not modelled."""
    t, m = run.training, run.model
    p = []
    if t.framework != "megatron":
        mixer = m.mixer_name or "Mamba"
        p.append(f"framework={t.framework} with {m.name}: a hybrid {mixer} model runs in Megatron-Core "
                 f"(HybridModel); TorchTitan has no {mixer} layer")
    if not m.hybrid_pairs:  # a hybrid_pairs GPTModel (Qwen3-Next) splits whole transformer layers (assignment_of)
        # Megatron-Core select_pipeline_segment: a hybrid model's stages are an even split, first/last stage layer
        # counts, or '|' separators in its pattern (here: pipeline_model_parallel_layout, one '|' per boundary)
        if t.vpp > 1 and not t.pipeline_model_parallel_layout:
            p.append(f"vpp={t.vpp} with the hybrid model {m.name}: Megatron-Core takes virtual pipeline stages of a "
                     f"hybrid model only from '|' separators in its layer pattern; give them as "
                     f"pipeline_model_parallel_layout (one '|' per stage boundary), or use vpp=1")
        if t.account_for_embedding_in_pipeline_split or t.account_for_loss_in_pipeline_split:
            p.append(f"account_for_embedding/loss_in_pipeline_split with the hybrid model {m.name}: Megatron-Core "
                     f"splits a hybrid model by its layer pattern (evenly, decoder_first/last_pipeline_num_layers, or "
                     f"'|' separators: pipeline_model_parallel_layout), not by these flags")
    if "gdn" in m.layer_kinds:
        p += _gdn_problems(run)
    if "mamba" in m.layer_kinds:
        p += _mamba_problems(run)
    if t.moe_a2a_overlap and m.mixer_name:
        p.append(f"moe_a2a_overlap=true with the hybrid model {m.name}: the merged forward/backward all-to-all "
                 f"overlap is not modelled for {m.mixer_name} layers")
    return p


def _mamba_problems(run: RunConfig) -> list[str]:
    """Mamba layers: what Megatron-Core's MambaMixer asserts of the layout (heads and groups split over TP, and over
    CP by MambaContextParallel), and FP8's alignment of its in_proj."""
    t, m = run.training, run.model
    p = []
    heads, groups = m.mamba_heads, m.mamba_num_groups
    if heads % t.tp or groups % t.tp:
        p.append(f"tp={t.tp} must divide the {heads} Mamba heads and the {groups} Mamba groups of {m.name} "
                 f"(Megatron-Core MambaMixer: each TP rank holds whole heads and groups)")
    elif t.cp > 1:
        # MambaContextParallel: the heads of a TP rank shard over cp; its groups shard too, or repeat when fewer
        g = groups // t.tp
        if (heads // t.tp) % t.cp or (t.cp % g if g < t.cp else g % t.cp):
            p.append(f"cp={t.cp} with tp={t.tp}: Mamba context parallelism shards each TP rank's {heads // t.tp} "
                     f"heads and {g} groups over cp (Megatron-Core MambaContextParallel): cp must divide the heads, "
                     f"and divide or be a multiple of the groups")
    if t.precision != "bf16" and m.mamba_in_proj_width % 16:
        p.append(f"precision={t.precision} with {m.name}: the Mamba in_proj output width {m.mamba_in_proj_width} "
                 f"must be a multiple of 16 for FP8 (Megatron-Core MambaMixer)")
    return p


def _gdn_problems(run: RunConfig) -> list[str]:
    """Gated DeltaNet layers: what Megatron-Core's GatedDeltaNet asserts of the layout (its in_proj sections and
    heads split over TP, and over CP after the all-to-all)."""
    t, m = run.training, run.model
    nk, nv = m.gdn_num_key_heads, m.gdn_num_value_heads
    if nk % t.tp or nv % t.tp:
        return [f"tp={t.tp} must divide the {nk} key heads and the {nv} value heads of {m.name}'s Gated DeltaNet "
                f"layers (Megatron-Core GatedDeltaNet: each TP rank holds whole heads)"]
    if (nk // t.tp) % t.cp or (nv // t.tp) % t.cp:
        return [f"cp={t.cp} with tp={t.tp}: Gated DeltaNet context parallelism shards each TP rank's {nk // t.tp} "
                f"key and {nv // t.tp} value heads over cp (Megatron-Core GatedDeltaNet all-to-all): cp must divide "
                f"both"]
    if t.precision != "bf16" and m.gdn_in_proj_width % 16:
        return [f"precision={t.precision} with {m.name}: the Gated DeltaNet in_proj output width "
                f"{m.gdn_in_proj_width} must be a multiple of 16 for FP8 (Megatron-Core GatedDeltaNet)"]
    return []


def _param_gather_problems(run: RunConfig) -> list[str]:
    """fp8_param_gather: FP8/FP4 weights, gathered by the distributed optimizer or Megatron-FSDP."""
    t = run.training
    if not t.fp8_param_gather:
        return []
    p = []
    if t.precision not in ("fp8", "nvfp4"):
        p.append(f"fp8_param_gather=true needs precision=fp8 (FP8 weights) or nvfp4 (FP4 weights), got "
                 f"precision={t.precision}")
    if (t.fsdp and not t.use_megatron_fsdp) or not (t.use_distributed_optimizer or t.fsdp):
        p.append("fp8_param_gather=true needs the distributed optimizer or Megatron-FSDP (use_distributed_optimizer"
                 f"=true, or fsdp=true with use_megatron_fsdp=true), got use_distributed_optimizer="
                 f"{str(t.use_distributed_optimizer).lower()}, fsdp={str(t.fsdp).lower()}")
    return p


def _layer_graph_problems(t: TrainingConfig, m: ModelCard, sc: list[str]) -> list[str]:
    """Per-layer CUDA graphs (cuda_graph_impl local / transformer_engine): Megatron-Core 0.19.2 TransformerConfig's
    assertions on the scopes and their company, its messages quoted."""
    p = []
    if "moe" in sc and "moe_router" in sc:
        p.append("cuda_graph_scope lists moe and moe_router: Megatron-Core refuses it ('cuda_graph_modules must not "
                 "contain both moe and moe_router')")
    if t.cuda_graph_impl == "transformer_engine" and "moe_preprocess" in sc and "moe_router" not in sc:
        p.append("cuda_graph_scope moe_preprocess without moe_router: Megatron-Core refuses it ('moe_preprocess cuda "
                 "graph is only supported with moe_router cuda graph')")
    if m.is_moe and "moe" in sc and not (t.moe_expert_capacity_factor is not None
                                         and t.moe_pad_expert_input_to_capacity):
        p.append("cuda_graph_scope moe needs drop-and-pad MoE (moe_expert_capacity_factor with "
                 "moe_pad_expert_input_to_capacity=true): Megatron-Core refuses it otherwise ('moe cuda graph is only "
                 "supported with drop-padding MoE')")
    elif ("moe_preprocess" in sc and t.moe_a2a_backend == "alltoall" and t.moe_expert_capacity_factor is not None):
        p.append("cuda_graph_scope moe_preprocess with the alltoall dispatcher and a capacity factor: Megatron-Core "
                 "refuses it ('moe_preprocess cuda graph is not supported when there are DtoH copies and "
                 "synchronizations in the preprocess step')")
    return p


def _graph_recompute_problems(run: RunConfig) -> list[str]:
    """Per-layer CUDA graphs with recomputation (Megatron-Core 0.19.2 TransformerConfig, its messages quoted). Apart
    from :func:`_cuda_graph_problems`, which reads no parallel-layout field: see :data:`RULES`."""
    t = run.training
    if t.cuda_graph_impl not in ("local", "transformer_engine") or full_iteration(t):  # a whole-iteration graph
        return []
    if t.recompute == "full":
        return [f"recompute=full with cuda_graph_impl={t.cuda_graph_impl}: Megatron-Core refuses it ('full "
                f"recompute is only supported with full iteration CUDA graph'); use cuda_graph_impl=full_iteration "
                f"or selective recompute"]
    if t.cuda_graph_impl == "transformer_engine" and "moe" in t.recomputed_modules and (
            "moe_router" in t.cuda_graph_scope):
        return ["recompute_modules 'moe' with cuda_graph_scope moe_router under cuda_graph_impl=transformer_engine: "
                "Megatron-Core refuses it ('moe recompute is not supported with moe_router CUDA graph')"]
    return []


def _cuda_graph_problems(run: RunConfig) -> list[str]:
    """CUDA graphs: Megatron-Core's TransformerConfig checks of cuda_graph_impl / cuda_graph_scope, and the
    physics (a graph holds no device-to-host sync: a dropless MoE dispatcher cannot be captured)."""
    t, m = run.training, run.model
    sc = list(t.cuda_graph_scope)
    if t.cuda_graph_impl == "none":
        return [f"cuda_graph_scope={sc} needs cuda_graph_impl=local or transformer_engine (none captures "
                f"nothing)"] if sc else []
    p = []
    if len(set(sc)) != len(sc):
        p.append(f"cuda_graph_scope={sc} lists a scope twice")
    whole = {"full", "full_iteration"} & set(sc)
    if whole and len(sc) > 1:
        p.append(f"cuda_graph_scope={sc}: {sorted(whole)[0]} captures everything and combines with no other scope")
    if "full_iteration" in sc and t.cuda_graph_impl != "local":
        p.append(f"cuda_graph_scope=full_iteration needs cuda_graph_impl=local (Megatron-Core's whole-iteration "
                 f"graph), got {t.cuda_graph_impl}")
    if t.cuda_graph_impl == "full_iteration":
        if sc:
            p.append(f"cuda_graph_impl=full_iteration captures the whole iteration: cuda_graph_scope must be empty, "
                     f"got {sc}")
        whole = {"full_iteration"}
    else:
        p += _layer_graph_problems(t, m, sc)
    kinds = set(m.layer_kinds)
    if "mlp" in sc and not kinds & {"dense", "mlp"}:
        p.append(f"cuda_graph_scope 'mlp' captures dense MLP layers; {m.name} has MoE layers only (use moe or "
                 f"moe_router)")
    if "mamba" in sc and "mamba" not in kinds:
        p.append(f"cuda_graph_scope 'mamba' captures Mamba layers; {m.name} has none")
    for moe_scope in ("moe", "moe_router", "moe_preprocess"):
        if moe_scope in sc and not m.is_moe:
            p.append(f"cuda_graph_scope {moe_scope!r} needs a MoE model; {m.name} is dense")
    if m.is_moe and t.moe_host_sync and kinds & MOE_KINDS and (whole or "moe" in sc or not sc):
        what = "the whole layer" if (whole or not sc) else "the MoE block"
        label = "cuda_graph_impl=full_iteration" if t.cuda_graph_impl == "full_iteration" else f"cuda_graph_scope={sc or ['full']}"
        p.append(f"{label} captures {what} with the MoE dispatcher, which reads the "
                 f"per-expert token counts on the host every forward (dropless): a graph cannot hold that sync. "
                 f"Use moe_expert_capacity_factor with moe_pad_expert_input_to_capacity=true (static shapes), "
                 f"HybridEP with moe_expert_rank_capacity_factor and fused_grouped_mlp=true, sync-free MoE, or "
                 f"scopes attn / moe_router")
    if t.cpu_offloading and t.cuda_graph_impl not in ("none", "full_iteration"):
        p.append(f"cpu_offloading=true with cuda_graph_impl={t.cuda_graph_impl}: Megatron-Core supports CUDA graphs "
                 f"with CPU offloading only as cuda_graph_impl=full_iteration")
    if t.framework == "torchtitan":
        p.append(f"cuda_graph_impl={t.cuda_graph_impl} with framework=torchtitan: TorchTitan has no CUDA graph option")
    return p


def _dispatcher_problems(run: RunConfig) -> list[str]:
    """The flex dispatcher's options (Megatron-Core TransformerConfig.__post_init__ checks and the physics)."""
    t, m, hw = run.training, run.model, run.cluster.hardware
    p = []
    sms = t.moe_flex_dispatcher_num_sms
    if sms is not None:
        if t.moe_a2a_backend not in ("deepep", "hybridep"):
            p.append(f"moe_flex_dispatcher_num_sms={sms} sizes the flex dispatcher's kernels: it needs moe_a2a_backend="
                     f"deepep or hybridep, got {t.moe_a2a_backend}")
        elif not 0 < sms < hw.num_compute_units:
            p.append(f"moe_flex_dispatcher_num_sms={sms} must be between 1 and {hw.num_compute_units - 1} (the "
                     f"{hw.num_compute_units} compute units of {hw.name})")
    rcf = t.moe_expert_rank_capacity_factor
    if rcf is not None:
        if t.moe_a2a_backend != "hybridep":
            p.append(f"moe_expert_rank_capacity_factor={rcf} is HybridEP's static budget: it needs moe_a2a_backend="
                     f"hybridep, got {t.moe_a2a_backend}")
        elif not rcf >= 1.0:
            p.append(f"moe_expert_rank_capacity_factor={rcf} must be >= 1.0 (the budget over the mean per-rank load; "
                     f"below 1 even balanced routing drops tokens)")
    if t.moe_paged_stash:
        if rcf is None:
            p.append("moe_paged_stash=true needs moe_expert_rank_capacity_factor (Megatron-Core: no paged stash "
                     "without a static budget)")
        if t.cpu_offloading:
            p.append("moe_paged_stash=true cannot run with cpu_offloading=true (Megatron-Core)")
    if not t.moe_paged_stash_buffer_factor > 0:
        p.append(f"moe_paged_stash_buffer_factor={t.moe_paged_stash_buffer_factor} must be > 0")
    if t.moe_shared_expert_overlap and m.is_moe and not m.num_shared_experts:
        p.append(f"moe_shared_expert_overlap=true overlaps shared experts; {m.name} has none")
    if t.delay_wgrad_compute and not t.moe_a2a_overlap:
        p.append("delay_wgrad_compute=true needs moe_a2a_overlap=true (Megatron-Core: overlap_moe_expert_parallel_comm "
                 "must be enabled with delay_wgrad_compute)")
    if t.fused_grouped_mlp:
        if not m.is_moe:
            p.append(f"fused_grouped_mlp=true fuses the routed experts' MLP; {m.name} is dense")
        elif not m.gated and m.activation != "squared_relu":  # Megatron-Core experts._is_fused_impl_supported
            p.append(f"fused_grouped_mlp=true needs a gated (GLU) or squared-ReLU expert MLP (Transformer Engine's "
                     f"op fuser); {m.name} has activation {m.activation}")
        if t.framework != "megatron":
            p.append("fused_grouped_mlp=true is Transformer Engine's op fuser: it needs framework=megatron")
        # Megatron-Core TEGroupedMLP._is_fused_impl_supported (asserted when the op fuser is on)
        if t.etp > 1:
            p.append(f"fused_grouped_mlp=true with etp={t.etp}: Megatron-Core's op-fuser grouped MLP has no expert "
                     f"tensor parallelism (etp must be 1)")
        offloaded = sorted({"expert_fc1", "moe_act"} & set(t.offload_modules or ()))
        if offloaded:
            p.append(f"fused_grouped_mlp=true with offload_modules {', '.join(offloaded)}: Megatron-Core offloads "
                     f"those only on the unfused path (offload fused_group_mlp instead)")
    return p


def _precision_feature_problems(run: RunConfig) -> list[str]:
    """FP8 attention, the attention backend and BF16 first/last layers (Megatron-Core TransformerConfig checks)."""
    t, m, hw = run.training, run.model, run.cluster.hardware
    p = []
    if t.fp8_dot_product_attention:
        if t.precision not in ("fp8", "nvfp4"):
            p.append(f"fp8_dot_product_attention=true needs an FP8/FP4 recipe (precision fp8 or nvfp4), got "
                     f"precision={t.precision}")
        elif not hw.supports("fp8"):
            p.append(f"fp8_dot_product_attention=true needs FP8 tensor cores; {hw.name} has none")
        if t.framework != "megatron":
            p.append("fp8_dot_product_attention=true is Transformer Engine's FP8 attention: it needs framework=megatron")
        if m.attention_sinks and hw.vendor.lower() == "nvidia" and not hw.fp8_any_layout:
            # TE get_attention_backend: learnable softmax disables FlashAttention; in FP8 it disables the unfused
            # path and, before compute capability 10.0 (or with cuDNN < 9.21), the fused one (TE 2.20; 2.8-2.19
            # disable both everywhere): no backend is left
            p.append(f"fp8_dot_product_attention=true with {m.name}'s learnable softmax sinks: Transformer Engine has "
                     f"an FP8 attention backend for sink attention only on Blackwell with cuDNN >= 9.21 (TE 2.20); "
                     f"{hw.name} is {hw.arch}: use fp8_dot_product_attention=false")
        if hw.vendor.lower() == "nvidia" and t.precision == "fp8":
            # TE get_attention_backend in FP8: FlashAttention takes no FP8 training and the unfused path no FP8, so
            # the fused one must: not with per-tensor current scaling before compute capability 10.0 (TE 2.8-2.20),
            # nor with FP8 block scaling anywhere (TE 2.20); no backend is left
            if t.fp8_recipe == "tensorwise" and not hw.sm100_class:
                p.append(f"fp8_dot_product_attention=true with fp8_recipe=tensorwise (per-tensor current scaling): "
                         f"Transformer Engine's fused FP8 attention takes current scaling only on Blackwell (compute "
                         f"capability 10.x; TE 2.8-2.20), and no other backend runs FP8 attention in training; "
                         f"{hw.name} is {hw.arch}: use fp8_recipe=delayed, or fp8_dot_product_attention=false")
            elif t.fp8_recipe == "blockwise":
                p.append("fp8_dot_product_attention=true with fp8_recipe=blockwise: Transformer Engine has no FP8 "
                         "attention backend for FP8 block scaling (TE 2.20 disables its fused attention for it): use "
                         "fp8_dot_product_attention=false (attention in BF16)")
    if t.attention_backend == "local":
        p.append("attention_backend=local is Megatron-Core's own attention, which needs --spec local (layers without "
                 "Transformer Engine: not priced here); valid: auto, flash, fused, or unfused (Transformer Engine's "
                 "unfused attention)")
    elif t.attention_backend != "auto" and t.framework != "megatron":
        p.append(f"attention_backend={t.attention_backend} is Megatron-Core's setting; framework={t.framework} runs "
                 "PyTorch's scaled_dot_product_attention: leave it at auto")
    elif t.attention_backend == "unfused":
        # Transformer Engine: context parallelism and FP8 attention run only in its flash / fused backends
        if t.cp > 1:
            p.append(f"attention_backend=unfused cannot run context parallelism (cp={t.cp}): Transformer Engine's "
                     "context-parallel attention needs the flash or fused backend; use cp=1 or attention_backend=auto")
        if t.fp8_dot_product_attention:
            p.append("attention_backend=unfused cannot run fp8_dot_product_attention=true (FP8 attention is Transformer "
                     "Engine's fused backend)")
    if t.fp8_output_proj and not (t.precision == "fp8" and t.fp8_recipe == "mxfp8"):
        p.append(f"fp8_output_proj=true runs the LM head under MXFP8: it needs precision=fp8 with fp8_recipe=mxfp8 "
                 f"(Megatron-Core), got precision={t.precision}, fp8_recipe={t.fp8_recipe}")
    if t.first_last_layers_bf16:
        if t.precision == "bf16":
            p.append("first_last_layers_bf16=true keeps layers in BF16 under an FP8/FP4 recipe: precision is already bf16")
        a, b = t.num_layers_at_start_in_bf16, t.num_layers_at_end_in_bf16
        if a < 0 or b < 0 or a + b > m.pipeline_layers:
            p.append(f"num_layers_at_start_in_bf16={a} + num_layers_at_end_in_bf16={b} must be >= 0 each and at most "
                     f"the {m.pipeline_layers} layers of {m.name}")
    if t.muon_ns_steps < 1:
        p.append(f"muon_ns_steps={t.muon_ns_steps} must be >= 1")
    if t.optimizer == "muon" and t.fsdp and t.framework == "megatron":
        # Megatron-LM validate_args: "Emerging optimizer does not support Torch-FSDP2 / Megatron-FSDP for now"
        p.append("optimizer=muon cannot run with fsdp=true (Megatron-LM's emerging optimizers support neither "
                 "Torch-FSDP2 nor Megatron-FSDP); use use_distributed_optimizer=true, its layer-wise sharding")
    if t.mtp_num_layers is not None and t.mtp_num_layers < 0:
        p.append(f"mtp_num_layers={t.mtp_num_layers} must be >= 0 (None = the card's {m.mtp_layers})")
    return p


def _host_link_problems(run: RunConfig, what: str) -> list[str]:
    """An offload (``what``) moves tensors over the GPU-host link: the profile must give its bandwidth."""
    if run.cluster.hardware.host_link_bytes_per_s:
        return []
    return [f"{what} needs the GPU-host bandwidth: hardware {run.cluster.hardware.name!r} gives no "
            f"memory.host_link_gb_per_s"]


def _memory_feature_problems(run: RunConfig) -> list[str]:
    """CPU offloading and Megatron-FSDP (Megatron-Core TransformerConfig / DDP config checks)."""
    t, m = run.training, run.model
    p = []
    if t.cpu_offloading:
        if t.pp > 1:
            p.append(f"cpu_offloading=true with pp={t.pp}: Megatron-Core has no CPU offloading with pipeline parallelism")
        if t.recompute != "none":
            p.append(f"cpu_offloading=true with recompute={t.recompute}: Megatron-Core's CPU offloading does not work "
                     f"with activation recomputation")
        p += _host_link_problems(run, "cpu_offloading=true")
        if not 0 <= t.cpu_offloading_num_layers < m.num_layers:
            p.append(f"cpu_offloading_num_layers={t.cpu_offloading_num_layers} must be in 0..{m.num_layers - 1} (layers "
                     f"of {m.name})")
    elif t.cpu_offloading_num_layers or t.cpu_offloading_weights:
        p.append("cpu_offloading_num_layers / cpu_offloading_weights need cpu_offloading=true")
    if t.offload_modules:  # Megatron-Core TransformerConfig.__post_init__ (fine_grained_activation_offloading)
        mods = set(t.offload_modules)
        if t.framework != "megatron":
            p.append(f"offload_modules is Megatron-Core's fine-grained activation offloading; framework={t.framework} "
                     f"has none: leave it unset")
        if t.cpu_offloading:
            p.append("offload_modules (fine-grained activation offloading) cannot run with cpu_offloading=true "
                     "(Megatron-Core); use one or the other")
        if "attn_proj" in mods and "core_attn" not in mods:
            p.append("offload_modules: attn_proj needs core_attn too (its input is core attention's output, which "
                     "core attention's backward needs; Megatron-Core)")
        inside = sorted(mods & {"moe_act", "expert_fc1", "fused_group_mlp"})
        if inside and "moe" in t.recomputed_modules:
            p.append(f"offload_modules {', '.join(inside)} with recompute_modules 'moe': the MoE checkpoint already "
                     f"drops what they save (Megatron-Core refuses both)")
        p += _host_link_problems(run, "offload_modules")
    if t.use_megatron_fsdp and not t.fsdp:
        p.append("use_megatron_fsdp=true is an FSDP implementation: it needs fsdp=true")
    if t.fsdp_double_buffer and not t.use_megatron_fsdp:
        p.append("fsdp_double_buffer=true is Megatron-FSDP's: it needs use_megatron_fsdp=true")
    if t.use_megatron_fsdp and t.framework != "megatron":
        p.append("use_megatron_fsdp=true needs framework=megatron")
    return p


def _capacity_problems(run: RunConfig) -> list[str]:
    """Token-drop MoE: Megatron-Core's TransformerConfig checks (the capacity factor works with the
    all-to-all dispatcher only; padding to capacity needs a capacity factor)."""
    t, m = run.training, run.model
    cf = t.moe_expert_capacity_factor
    p = []
    if t.moe_pad_expert_input_to_capacity and cf is None:
        p.append("moe_pad_expert_input_to_capacity=true needs moe_expert_capacity_factor (the capacity it pads "
                 "to), e.g. 1.0")
    if cf is None:
        return p
    if not m.is_moe:
        p.append(f"moe_expert_capacity_factor={cf} needs a MoE model; {m.name} is dense")
    elif not cf > 0:
        p.append(f"moe_expert_capacity_factor={cf} must be > 0 (1.0 = each expert takes its mean share; None = "
                 "dropless)")
    elif cf > m.num_experts / m.moe_topk:
        p.append(f"moe_expert_capacity_factor={cf} exceeds experts/top-k = {m.num_experts}/{m.moe_topk}: a capacity "
                 "above every token drops nothing and pads beyond the micro-batch; use None (dropless)")
    if t.moe_a2a_backend != "alltoall":
        p.append(f"moe_expert_capacity_factor with moe_a2a_backend={t.moe_a2a_backend}: Megatron-Core drops tokens "
                 "in the alltoall dispatcher only")
    return p


def _framework_problems(run: RunConfig) -> list[str]:
    """What TorchTitan cannot run (its job config, torchtitan/config/job_config.py), and torch_compile
    outside it. TorchTitan 0.3 runs NVFP4 (NVFP4LinearConverter, torchao's nvfp4_training kernels) and the DeepEP and
    HybridEP token dispatchers (models/common/token_dispatcher.py; in training host-synced, as Megatron's)."""
    t = run.training
    if t.framework != "torchtitan":
        return ["torch_compile=true needs framework=torchtitan (Megatron-LM fuses with Transformer Engine "
                "kernels, not torch.compile)"] if t.torch_compile else []
    p = []
    dp = run.cluster.num_gpus // (t.tp * t.pp * t.cp)
    if t.use_distributed_optimizer and not t.fsdp and dp > 1:
        p.append("framework=torchtitan has no distributed optimizer without FSDP (ZeRO-1): use fsdp=true (FSDP2, "
                 "its default) or use_distributed_optimizer=false (DDP)")
    unsupported = [("recompute_modules", t.recompute_modules is not None, "its selective checkpointing is op-level "
                    "(recompute=selective), not per Megatron module"),
                   ("moe_sync_free=true", t.moe_sync_free, "sync-free MoE is Primus-Turbo's"),
                   ("moe_a2a_overlap=true", t.moe_a2a_overlap, "it has no merged forward/backward all-to-all"),
                   ("moe_expert_capacity_factor", t.moe_expert_capacity_factor is not None,
                    "its MoE is dropless (token choice, no capacity)"),
                   ("fp8_param_gather=true", t.fp8_param_gather, "FSDP2's float8 all-gather is not modelled"),
                   ("fp8_recipe=blockwise", t.fp8_recipe == "blockwise",
                    "its float8 converters scale per tensor (tensorwise) or per 32-value block (mxfp8)"),
                   ("tp_comm_overlap=true", t.tp_overlap and not t.torch_compile,
                    "async tensor parallelism needs torch_compile=true")]
    for what, bad, why in unsupported:
        if bad:
            p.append(f"{what} with framework=torchtitan: {why}")
    m = run.model
    if m.attention != "mla" and t.tp > 1 and m.kv_heads % t.tp:
        # TorchTitan's decoder checks tp | n_kv_heads (models/common/decoder.py): its wk / wv shard whole heads
        p.append(f"tp={t.tp} with framework=torchtitan must divide the {m.kv_heads} KV heads of {m.name} (TorchTitan "
                 f"shards whole heads; Megatron-LM gathers the fused QKV output instead)")
    return p


def _a2a_overlap_problems(run: RunConfig) -> list[str]:
    """moe_a2a_overlap: Megatron-LM's argument checks for --overlap-moe-expert-parallel-comm
    (megatron/training/arguments.py, Megatron-Core 0.14+): EP > 1, no full recompute, PP 1 or interleaved."""
    t, m = run.training, run.model
    if not m.is_moe:
        return [f"moe_a2a_overlap=true needs a MoE model; {m.name} is dense"]
    p = []
    if t.ep <= 1:
        p.append("moe_a2a_overlap=true needs ep > 1 (with ep=1 there is no all-to-all to overlap)")
    if t.recompute == "full":
        p.append("moe_a2a_overlap=true does not run with recompute=full (Megatron refuses the pair); "
                 "use recompute=none or selective")
    if t.pp > 1 and t.schedule != "interleaved":
        p.append(f"moe_a2a_overlap=true with pp={t.pp} needs the interleaved schedule (vpp > 1; Megatron merges "
                 f"forward and backward only there or at pp=1), got pp_schedule={t.schedule}")
    # Megatron-Core TransformerConfig.__post_init__ (0.19.2), its messages quoted
    if t.moe_shared_expert_overlap:
        p.append("moe_a2a_overlap=true with moe_shared_expert_overlap=true: Megatron-Core refuses the pair ('disable "
                 "moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm'); set one of them false")
    if "moe" in t.recomputed_modules:
        p.append("moe_a2a_overlap=true with recompute_modules 'moe': Megatron-Core refuses the pair ('disable moe in "
                 "recompute_modules when enabling overlap_moe_expert_parallel_comm')")
    if m.mtp_layers > 1:
        p.append(f"moe_a2a_overlap=true with {m.mtp_layers} MTP layers: Megatron-Core refuses it ('MTP supports at "
                 f"most one layer when enabling overlap_moe_expert_parallel_comm'); set mtp_num_layers to 0 or 1")
    return p


def _recompute_module_problems(run: RunConfig) -> list[str]:
    """recompute_modules: selective only, known names, each naming a module the model has."""
    t, m = run.training, run.model
    mods = t.recompute_modules or ()
    if t.recompute != "selective":
        return [f"recompute_modules={list(mods)} only applies with recompute=selective, got recompute={t.recompute}"]
    if not mods:
        return ["recompute_modules=[] recomputes nothing: use recompute=none, or list modules from "
                f"{', '.join(RECOMPUTE_MODULES)}"]
    p = []
    if len(set(mods)) != len(mods):
        p.append(f"recompute_modules={list(mods)} lists a module twice")
    needs = {"mla_up_proj": (m.attention == "mla", f"an MLA model ({m.name} has {m.attention} attention)"),
             "moe_act": (m.is_moe, f"a MoE model ({m.name} is dense)"),
             "moe": (m.is_moe, f"a MoE model ({m.name} is dense)"),
             "shared_experts": (m.num_shared_experts > 0, f"shared experts ({m.name} has none)"),
             "mlp": (bool({"dense", "mlp"} & set(m.layer_kinds)),
                     f"dense MLP layers ({m.name} has MoE layers only; use moe)")}
    valid = [n for n in RECOMPUTE_MODULES if needs.get(n, (True, ""))[0]]
    for name in mods:
        if name not in RECOMPUTE_MODULES:
            p.append(f"recompute_modules: {name!r} is not a Megatron recompute module; valid for {m.name}: "
                     f"{', '.join(valid)}")
        elif not needs.get(name, (True, ""))[0]:
            p.append(f"recompute_modules: {name!r} needs {needs[name][1]}; valid for {m.name}: {', '.join(valid)}")
    if "shared_experts" in mods and t.moe_shared_expert_overlap and m.num_shared_experts:  # Megatron-Core
        p.append("recompute_modules 'shared_experts' with moe_shared_expert_overlap=true: Megatron-Core refuses the "
                 "pair ('shared_experts recompute cannot work with --moe-shared-expert-overlap')")
    return p


RULES: tuple[Callable[[RunConfig], list[str]], ...] = (
    _param_gather_problems, _cuda_graph_problems, _capacity_problems, _dispatcher_problems,
    _precision_feature_problems, _memory_feature_problems)
"""Rule groups :func:`check` applies to every run, each returning its own problems: a search space asks them on their
own, with the fields each reads tracked, to drop a setting combination that no parallel layout can make legal
(``searchers.space``)."""
