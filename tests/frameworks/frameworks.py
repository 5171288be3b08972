"""The frameworks' own config classes, read from ``.frameworks/`` (``scripts/install-frameworks.sh``).

Megatron-Core 0.19, Megatron-Bridge 0.6 and TorchTitan 0.3 need Python 3.12 and GPU stacks to run; their
config classes and Megatron-LM's argument parser are read in a child process (``probe.py``) so that
nothing they import touches the test process. What this module offers:

* ``unavailable()``: why the frameworks cannot be read here (tests skip with it), or None.
* ``catalog()``: every name they know (cached in ``.frameworks/catalog.json`` per install).
* ``check_names(mapping)``: which Megatron-Core / Megatron-Bridge / Megatron-LM names a mapping uses
  that no framework knows, and where each known one lives (for recipes: ``key=value`` per row).
* ``build_megatron(cases)`` / ``build_torchtitan(cases)``: the frameworks' own parsers and config
  objects applied to command lines; the error of each case, or None.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.hardware import HardwareProfile
from oracle.model_card import ModelCard
from raytune_primus.frameworks import FRAMEWORKS, PINS
from raytune_primus.frameworks import unavailable as not_installed
from tests.conftest import ROOT

PROBE = Path(__file__).with_name("probe.py")
PROBE_TIMEOUT_S = 900

ARCH_CAPABILITY: dict[str, tuple[int, int]] = {
    "ampere": (8, 0), "hopper": (9, 0), "blackwell": (10, 0), "blackwell-ultra": (10, 3)}
"""CUDA compute capability per hardware ``arch`` (NVIDIA CUDA GPUs table: A100 8.0, H100/H200 9.0,
B200/GB200 10.0, B300/GB300 10.3): what Megatron-LM's validate_args asks the GPU."""


class FrameworkError(RuntimeError):
    """The child process reading the frameworks failed."""


def unavailable() -> str | None:
    """Why the frameworks' config classes cannot be read here, or None when they can."""
    reason = not_installed()
    if reason:
        return reason
    try:
        catalog()
    except FrameworkError as exc:
        return f"the frameworks in {FRAMEWORKS} do not import on this machine: {exc}"
    return None


def probe(command: str, payload: Any) -> Any:
    """Run ``probe.py COMMAND`` on ``payload`` in a child process and return its answer."""
    with tempfile.TemporaryDirectory(prefix="frameworks-") as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(payload))
        env = {**os.environ, "RAYTUNE_PRIMUS_FRAMEWORKS": str(FRAMEWORKS), "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run([sys.executable, str(PROBE), command, str(src), str(dst)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        if proc.returncode != 0 or not dst.exists():
            tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or ["no output"]
            raise FrameworkError(f"probe.py {command} exited {proc.returncode}: {tail[0]}")
        return json.loads(dst.read_text())


@functools.cache
def catalog() -> dict[str, Any]:
    """Every name the installed frameworks know (see probe.catalog), read once per install."""
    cache = FRAMEWORKS / "catalog.json"
    key = hashlib.sha256(PINS.read_bytes() + PROBE.read_bytes()).hexdigest()  # these pins, read this way
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return cached
    data = {**probe("catalog", None), "key": key}
    cache.write_text(json.dumps(data))
    return data


# ------------------------------------------------------------------------------------------ name check
@dataclass(frozen=True, kw_only=True, slots=True)
class NameReport:
    """Which names of a mapping the frameworks know, and where."""

    known: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """name -> where it lives: ``package.module.Class.field`` of a config dataclass, ``--flag`` of
    Megatron-LM's parser, ``...ConfigContainer.env_vars[NAME]`` for ``env.NAME``."""
    unknown: tuple[str, ...] = ()
    """Names no config class, no section field and no Megatron-LM flag has."""
    aliased: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """name -> the framework names it was checked as (shorthands given in ``aliases``)."""
    bad_values: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    """name -> (a value it was given, the values Megatron-LM's flag accepts), for flags with choices."""


def _lookup(name: str, cat: dict[str, Any], megatron_classes: list[str], flags: dict[str, str]) -> list[str]:
    """Where a Megatron-Core / Megatron-Bridge / Megatron-LM name lives (empty: nowhere); ``flags`` maps each
    Megatron-LM flag to its argparse destination."""
    classes, sections = cat["classes"], cat["sections"]
    head, dot, rest = name.partition(".")
    if dot:
        if head == "env":  # the recipe's process environment (ConfigContainer.env_vars)
            return [f"{cat['bridge_container']}.env_vars[{rest}]"] if rest else []
        if head not in sections or "." in rest:
            return []
        where = [f"{cls}.{rest}" for cls in sections[head] if rest in classes.get(cls, {})]
        for dest in (rest, f"{head}_{rest}"):  # Megatron-LM's flag for it (ddp.x: --x or --ddp-x)
            if where and dest in cat["megatron_lm_args"]:
                where.append(cat["megatron_lm_args"][dest]["flags"][0])
                break
        return where
    where = [f"{cls}.{name}" for cls in megatron_classes if name in classes[cls]]
    arg = cat["megatron_lm_args"].get(name)
    flag = "--" + name.replace("_", "-")
    if arg:
        where += arg["flags"][:1]
    elif flag in flags:  # named by its flag (fp8_format: --fp8-format, stored as fp8)
        where.append(f"{flag} (argparse dest {flags[flag]})")
    return where


def check_names(mapping: Mapping[str, Any] | Iterable[str], *,
                aliases: Mapping[str, str | Iterable[str]] | None = None) -> NameReport:
    """Check Megatron-Core / Megatron-Bridge / Megatron-LM argument names against the installed frameworks.

    ``mapping``: names (``key`` or ``section.key`` with a Megatron-Bridge ConfigContainer section such as
    ``ddp``, ``comm_overlap``, ``mixed_precision``, ``model``, ``train``; ``env.NAME`` for an environment
    variable), or a mapping whose keys are those names. A bare name is looked up in every Megatron-Core
    and Megatron-Bridge config dataclass and in Megatron-LM's argparse destinations. ``aliases`` maps a
    shorthand (e.g. ``moe_a2a_overlap``) to the framework name(s) it stands for; the shorthand is known
    when every name it stands for is. Values (a mapping's: a string, or a set of strings) are checked only
    where the Megatron-LM flag of that name has a fixed set of choices.
    """
    cat = catalog()
    megatron_classes = [c for c in cat["classes"] if c.startswith("megatron.")]
    flags = {f: dest for dest, arg in cat["megatron_lm_args"].items() for f in arg["flags"]}
    aliases = aliases or {}
    known: dict[str, tuple[str, ...]] = {}
    aliased: dict[str, tuple[str, ...]] = {}
    unknown: list[str] = []
    bad_values: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name in mapping:
        targets = aliases.get(name, name)
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
        places = [_lookup(t, cat, megatron_classes, flags) for t in targets]
        if targets != (name,):
            aliased[name] = targets
        if not all(places):
            unknown.append(name)
            continue
        known[name] = tuple(p for ps in places for p in ps)
        arg = cat["megatron_lm_args"].get(name) or cat["megatron_lm_args"].get(
            flags.get("--" + name.replace("_", "-"), ""))
        if isinstance(mapping, Mapping) and arg and arg["choices"] and len(targets) == 1 and targets[0] == name:
            given = mapping[name]
            for value in sorted({given} if isinstance(given, str) else set(map(str, given))):
                if value not in arg["choices"]:
                    bad_values[name] = (value, tuple(arg["choices"]))
    return NameReport(known=known, unknown=tuple(unknown), aliased=aliased, bad_values=bad_values)


# ------------------------------------------------------------------------------------ building configs
def capability(hw: HardwareProfile) -> tuple[int, int]:
    """The CUDA compute capability of an NVIDIA profile (ARCH_CAPABILITY)."""
    if hw.arch not in ARCH_CAPABILITY:
        raise ValueError(f"hardware {hw.name!r} (arch {hw.arch!r}) is no NVIDIA CUDA part; "
                         f"known arches: {', '.join(ARCH_CAPABILITY)}")
    return ARCH_CAPABILITY[hw.arch]


def megatron_model_argv(card: ModelCard, seq_len: int) -> list[str]:
    """Megatron-LM model-architecture flags for a model card (the export leaves them to the model's recipe)."""
    argv = ["--num-layers", card.num_layers, "--hidden-size", card.hidden_size,
            "--num-attention-heads", card.num_attention_heads,
            "--max-position-embeddings", max(card.max_seq_len, seq_len), "--vocab-size", card.vocab_size,
            "--position-embedding-type", card.position_embedding if card.position_embedding != "none" else "none",
            "--normalization", {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[card.norm],
            "--tokenizer-type", "NullTokenizer", "--train-iters", 10, "--lr", 1e-4]
    if card.ffn_hidden_size:
        argv += ["--ffn-hidden-size", card.ffn_hidden_size]
    if card.is_hybrid:  # the pattern (an export with stage boundaries restates it with '|', the last one wins)
        argv += ["--hybrid-layer-pattern", card.hybrid_pattern, "--mamba-num-heads", card.mamba_heads,
                 "--mamba-head-dim", card.mamba_head_dim, "--mamba-state-dim", card.mamba_state_dim,
                 "--mamba-num-groups", card.mamba_num_groups]
    if card.head_dim:
        argv += ["--kv-channels", card.head_dim]
    if card.num_query_groups and card.num_query_groups != card.num_attention_heads:
        argv += ["--group-query-attention", "--num-query-groups", card.num_query_groups]
    if card.activation == "swiglu":
        argv.append("--swiglu")
    if not card.tied_embeddings:
        argv.append("--untie-embeddings-and-output-weights")
    if not card.linear_bias:
        argv.append("--disable-bias-linear")
    if card.qkv_bias:
        argv.append("--add-qkv-bias")
    if card.qk_layernorm:
        argv.append("--qk-layernorm")
    if card.attention == "mla":
        argv += ["--multi-latent-attention", "--kv-lora-rank", card.kv_lora_rank,
                 "--qk-head-dim", card.qk_nope_head_dim, "--qk-pos-emb-head-dim", card.qk_rope_head_dim,
                 "--v-head-dim", card.v_head_dim]
        if card.q_lora_rank:
            argv += ["--q-lora-rank", card.q_lora_rank]
    if card.num_experts:
        argv += ["--num-experts", card.num_experts, "--moe-router-topk", card.moe_topk]
        if card.moe_ffn_hidden_size:
            argv += ["--moe-ffn-hidden-size", card.moe_ffn_hidden_size]
        if card.num_shared_experts:
            argv += ["--moe-shared-expert-intermediate-size",
                     card.num_shared_experts * (card.shared_expert_ffn_hidden_size or card.moe_ffn_hidden_size)]
        if card.first_dense_layers or card.moe_layer_freq > 1:
            every = card.moe_layer_freq
            pattern = [0] * card.first_dense_layers + [
                int(i % every == 0) for i in range(card.num_layers - card.first_dense_layers)]
            argv += ["--moe-layer-freq", f"([{','.join(map(str, pattern))}])"]
    if card.mtp_layers:
        argv += ["--mtp-num-layers", card.mtp_layers]
    return [str(a) for a in argv]


def build_megatron(cases: list[dict[str, Any]]) -> list[str | None]:
    """Megatron-LM's parser, validate_args and config objects on each case ``{"argv", "world_size",
    "capability"}``; per case the framework's error, or None."""
    return probe("megatron", cases)


def build_torchtitan(cases: list[list[str]]) -> list[str | None]:
    """TorchTitan's ConfigManager.parse_args on each argv (``--module M --config C`` + overrides)."""
    return probe("torchtitan", cases)
