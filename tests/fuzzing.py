"""Fuzzing harness for every input file the tool reads (issue 13, "fuzzed input, zero tracebacks").

Each *kind* starts from a valid document (a bundled config, experiment, hardware profile, model card,
Hugging Face config.json, a validation CSV, a config's ``recipe:`` section, a Megatron-LM launch line, ``--set``
overrides), applies 1-3 random mutations drawn by hypothesis (a value replaced by NaN/inf, a huge or negative
number, unicode, a 5,000-character string, a list or a mapping; a key deleted or an unknown one added; a section
replaced by another type; two nodes made one YAML alias; the text truncated or garbled), writes it to a file and
feeds it to

* the CLI entry (``raytune_primus.cli.main(argv)`` in-process): the outcome must be exit code 0, or
  exit code 2 with ``error:`` lines on stderr, each short (:data:`MAX_LINE`), and no traceback;
* the library function that parses that kind: it must return or raise a ``PrimusError`` (never a
  bare TypeError/KeyError/ValueError/OSError/RecursionError).

Used by ``tests/test_fuzz_inputs.py`` (bounded, derandomized) and ``benchmarks/fuzz_inputs.py``
(many more cases, prints how many were tried and every failure).
"""
from __future__ import annotations

import contextlib
import copy
import csv
import io
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from oracle.errors import PrimusError

ROOT = Path(__file__).resolve().parents[1]
MAX_LINE = 1200
"""Longest error line accepted as short: a list of valid keys runs to ~700 characters; an echoed
5,000-character value must be clipped."""

# ---------------------------------------------------------------------------------------------- values
NASTY_VALUES: list[Any] = [
    float("nan"), float("inf"), float("-inf"), -0.0, 0, -1, -7, 0.5, 1e308, 2**31, 2**63, 10**30, 10**400,
    -(10**400), "", " ", "nan", "inf", "-inf", "1e999", "0x10", "true", "null", "~", "é", "😀😀😀", "x" * 5000,
    "名前" * 2500, "../../etc/passwd", "a/b.yaml", "nul\x00byte", "-", "NaN", None, True, False, [], {}, [1, 2],
    {"value": 1}, [[[[[[]]]]]], {"a": {"b": {"c": {}}}},
]
NASTY_CELLS: list[str] = ["", " ", "nan", "inf", "-inf", "-1", "0", "1e400", "abc", "é", "x" * 5000, "1.5", "2**8",
                          "true", "nul\x00byte", "=1+1", '"', "1,5", "../x.yaml", "9" * 400]


def nasty() -> st.SearchStrategy[Any]:
    # copies: a drawn [] or {} is mutated later, and must not change the next case's draws
    return st.one_of(st.sampled_from(NASTY_VALUES).map(copy.deepcopy), st.integers(min_value=-(2**70), max_value=2**70),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30))


def cells() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NASTY_CELLS), st.text(max_size=20))


# ---------------------------------------------------------------------------------------------- documents
def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out.extend(_paths(v, prefix + (k,)))
    return out


def _cyclic(node: Any, stack: tuple[int, ...] = ()) -> bool:
    if not isinstance(node, (dict, list)):
        return False
    if id(node) in stack:
        return True
    children = node.values() if isinstance(node, dict) else node
    return any(_cyclic(c, stack + (id(node),)) for c in children)


def _get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def mutate(doc: dict[str, Any], data: st.DataObject) -> tuple[dict[str, Any], list[str]]:
    """``doc`` with 1-3 structural mutations drawn from ``data``, and a description of each."""
    doc = copy.deepcopy(doc)
    done = []
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(doc)
        op = data.draw(st.sampled_from(["set", "set", "set", "delete", "add", "alias"]), label="op")
        if not paths:
            op = "add"
        if op == "add":
            targets = [()] + [p for p in paths if isinstance(_get(doc, p), dict)]
            where = targets[data.draw(st.integers(0, len(targets) - 1), label="where")]
            key = data.draw(st.one_of(st.sampled_from(["unknown_key", "", "x" * 300, "é"]), st.text(max_size=10)),
                            label="key")
            value = data.draw(nasty(), label="value")
            _get(doc, where)[key] = value
            done.append(f"add {'.'.join(map(str, where + (key,)))!s:.80}={value!r:.80}")
            continue
        path = paths[data.draw(st.integers(0, len(paths) - 1), label="path")]
        parent = _get(doc, path[:-1])
        if op == "delete":
            del parent[path[-1]]
            done.append(f"delete {'.'.join(map(str, path)):.80}")
        elif op == "alias":
            src = paths[data.draw(st.integers(0, len(paths) - 1), label="source")]
            if path[: len(src)] == src or src[: len(path)] == path:
                continue  # a node aliased into itself or its parent: yaml.dump would recurse
            before = parent[path[-1]]
            parent[path[-1]] = _get(doc, src)  # the same object twice: yaml.dump writes &id001 / *id001
            if _cyclic(doc):  # a node inside itself (the explicit tests cover recursive aliases)
                parent[path[-1]] = before
                continue
            done.append(f"alias {'.'.join(map(str, path)):.80} -> {'.'.join(map(str, src)):.80}")
        else:
            value = data.draw(nasty(), label="value")
            parent[path[-1]] = value
            done.append(f"set {'.'.join(map(str, path)):.80}={value!r:.80}")
    return doc, done


def garble(text: str, data: st.DataObject) -> tuple[str, str]:
    """Maybe damage the serialized text itself (truncate, insert characters, drop a line)."""
    op = data.draw(st.sampled_from(["none", "none", "none", "truncate", "insert", "dropline"]), label="text op")
    if op == "none" or not text:
        return text, ""
    at = data.draw(st.integers(0, len(text) - 1), label="at")
    if op == "truncate":
        return text[:at], f"truncated at {at}"
    if op == "insert":
        junk = data.draw(st.sampled_from(["{", "]", ":", "\t", "- ", "&a ", "*a", "!!python/object:os.system ",
                                          "\ufeff", "\x00", "'", '"', "\n  x: 1\n"]), label="junk")
        return text[:at] + junk + text[at:], f"inserted {junk!r} at {at}"
    lines = text.splitlines(keepends=True)
    i = at % len(lines)
    return "".join(lines[:i] + lines[i + 1:]), f"dropped line {i + 1}"


def _dump_yaml(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=10**6)


# ---------------------------------------------------------------------------------------------- running
@dataclass
class Outcome:
    rc: int
    stdout: str
    stderr: str


def run_cli(argv: list[str]) -> Outcome:
    """``raytune_primus.cli.main(argv)`` in-process; SystemExit becomes the exit code."""
    from raytune_primus.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    return Outcome(int(rc or 0), out.getvalue(), err.getvalue())


def check_cli(outcome: Outcome, case: str) -> None:
    """Exit 0, or exit 2 with short ``error:`` lines and no traceback."""
    assert "Traceback" not in outcome.stderr, f"{case}: traceback\n{outcome.stderr[-3000:]}"
    assert outcome.rc in (0, 2), f"{case}: exit code {outcome.rc}\n{outcome.stderr[-2000:]}"
    if outcome.rc == 2:
        errors = [ln for ln in outcome.stderr.splitlines() if ln.startswith("error:")]
        assert errors, f"{case}: exit 2 without an error line: {outcome.stderr[-1000:]!r}"
        long = [ln for ln in errors if len(ln) > MAX_LINE]
        assert not long, f"{case}: error line of {len(long[0])} characters: {long[0][:300]}..."


def check_lib(fn: Callable[[], Any], case: str) -> Any:
    """Call a library parser: a result, or a PrimusError; anything else fails the case."""
    try:
        return fn()
    except PrimusError:
        return None
    except Exception as exc:  # the finding: report it with the case that caused it
        raise AssertionError(f"{case}: {type(exc).__name__} escaped the library: {exc!s:.500}") from exc


@dataclass
class Kind:
    """One input kind: a seed document, how to write it, the CLI call and the library call."""

    name: str
    seed: Callable[[], Any]
    write: Callable[[Any, Path, st.DataObject], tuple[Path, str]]
    argv: Callable[[Path, Path], list[str]]
    library: Callable[[Path, Any], Any]
    examples: int = 40
    tried: int = field(default=0)
    results: int = field(default=0)
    """Cases the CLI answered with exit code 0 (a result, not an error)."""


_counter = itertools.count()


def _fresh(tmp: Path, name: str) -> Path:
    d = tmp / f"case{next(_counter)}"  # a new path per case: the registries cache parsed files by path
    d.mkdir(parents=True, exist_ok=True)
    return d / name


def _write_text(name: str, render: Callable[[Any], str]) -> Callable[[Any, Path, st.DataObject], tuple[Path, str]]:
    """A kind's writer: the document rendered as text, garbled, written to a fresh ``name``."""
    def write(doc: Any, tmp: Path, data: st.DataObject) -> tuple[Path, str]:
        text, how = garble(render(doc), data)
        p = _fresh(tmp, name)
        p.write_text(text, encoding="utf-8", errors="surrogateescape")
        return p, how
    return write


def _text_of(path: Path) -> str:
    """What a kind's writer wrote (its surrogate-escaped bytes back as they were)."""
    return path.read_text(encoding="utf-8", errors="surrogateescape")


def _write_yaml(name: str) -> Callable[[Any, Path, st.DataObject], tuple[Path, str]]:
    return _write_text(name, _dump_yaml)


_write_json = _write_text("config.json", lambda doc: json.dumps(doc, ensure_ascii=False))


def _load_yaml(rel: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / rel).read_text())


# ---------------------------------------------------------------------------------------------- kinds
def _config_seed() -> dict[str, Any]:
    return _load_yaml("tests/fixtures/configs/llama70b-h100.yaml")


def _inline_config_seed() -> dict[str, Any]:
    """A config whose model card is inline, so card fields are fuzzed through the project command."""
    return {"model": _load_yaml("oracle/models/tiny-moe.yaml"), "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
            "training": {"seq_len": 2048, "gbs": 64, "mbs": 1, "tp": 1, "pp": 2, "ep": 2, "precision": "bf16"}}


def _recipe_config_seed() -> dict[str, Any]:
    """A MoE config with a ``recipe:`` section in Megatron-Core / Megatron-Bridge names (oracle.recipe)."""
    return {"model": "tiny-moe", "cluster": {"hardware": "h100-sxm", "num_gpus": 8},
            "training": {"seq_len": 2048, "gbs": 64, "pp": 2, "ep": 2},
            "recipe": {"recompute_granularity": "selective", "recompute_modules": ["core_attn", "moe_act"],
                       "moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
                       "cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn"],
                       "moe_expert_rank_capacity_factor": 1.5, "comm_overlap.tp_comm_overlap": True,
                       "ddp.grad_reduce_in_fp32": False}}


def _lib_config(path: Path, doc: Any) -> Any:
    from oracle.config import RunConfig
    return RunConfig.load(path)


def _lib_experiment(path: Path, doc: Any) -> Any:
    from searchers.experiment import load_experiment
    exp = load_experiment(path)
    return exp.space


def _lib_hardware(path: Path, doc: Any) -> Any:
    from oracle.hardware import load_hardware, profile_from_dict
    hw = load_hardware(str(path))
    if isinstance(doc, dict):
        check_lib(lambda: profile_from_dict(doc, "fuzz"), "profile_from_dict")
    return hw.memory_cap_bytes()


def _lib_card(path: Path, doc: Any) -> Any:
    from oracle.model_card import ModelCard, load_model
    card = load_model(str(path))
    if isinstance(doc, dict):
        check_lib(lambda: ModelCard.from_dict(doc, name="fuzz").total_params(), "ModelCard.from_dict")
    return card.total_params(), card.active_params()


def _lib_hf(path: Path, doc: Any) -> Any:
    from oracle.hf_import import card_from_hf_config, card_to_yaml
    from oracle.yamlio import load_mapping
    card = card_from_hf_config(load_mapping(path, "Hugging Face config"), name="fuzz")
    return card_to_yaml(card)


CSV_HEADER = ["id", "group", "model", "hardware", "num_gpus", "seq_len", "gbs", "mbs", "tp", "pp", "vpp", "cp",
              "ep", "precision", "recompute", "measured_tokens_per_s_per_gpu", "measured_tflops_per_gpu",
              "measured_peak_mem_gib", "quality"]


def _csv_seed() -> list[list[str]]:
    return [CSV_HEADER,
            ["r1", "g", "llama3.1-8b", "h100-sxm", "8", "8192", "128", "1", "1", "1", "", "1", "", "bf16", "",
             "12000", "", "", "A"],
            ["r2", "g", "tiny-moe", "h100-sxm", "8", "2048", "64", "1", "1", "2", "", "1", "2", "fp8", "full",
             "", "300", "40", "B"]]


def _mutate_csv(rows: list[list[str]], data: st.DataObject) -> tuple[list[list[str]], list[str]]:
    rows = [list(r) for r in rows]
    done = []
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        op = data.draw(st.sampled_from(["cell", "cell", "number", "number", "drop_column", "extra_cell",
                                        "short_row", "header_cell", "empty_row"]), label="op")
        r = data.draw(st.integers(1, len(rows) - 1), label="row") if len(rows) > 1 else 0
        width = max(1, len(rows[r]))
        c = data.draw(st.integers(0, width - 1), label="col")
        if op == "number" and rows[r]:  # a numeric or name column, a value that breaks naive parsing
            col = data.draw(st.sampled_from(["num_gpus", "seq_len", "gbs", "mbs", "tp", "pp", "model", "hardware",
                                             "id", "measured_tokens_per_s_per_gpu", "measured_peak_mem_gib"]),
                            label="column")
            c = rows[0].index(col) if col in rows[0] else 0
            if c < len(rows[r]):
                rows[r][c] = data.draw(st.sampled_from(NASTY_CELLS), label="cell")
                done.append(f"row {r} {col} = {rows[r][c]!r:.60}")
        elif op == "cell" and rows[r]:
            rows[r][c] = data.draw(cells(), label="cell")
            done.append(f"row {r} col {c} = {rows[r][c]!r:.60}")
        elif op == "drop_column":
            for row in rows:
                if c < len(row):
                    del row[c]
            done.append(f"drop column {c}")
        elif op == "extra_cell":
            rows[r].append(data.draw(cells(), label="cell"))
            done.append(f"extra cell in row {r}")
        elif op == "short_row":
            rows[r] = rows[r][:c]
            done.append(f"row {r} cut to {c} cells")
        elif op == "header_cell":
            rows[0][c % len(rows[0])] = data.draw(cells(), label="cell")
            done.append(f"header col {c} = {rows[0][c % len(rows[0])]!r:.60}")
        else:
            rows.insert(r, [])
            done.append(f"empty row at {r}")
    return rows, done


def _write_csv(rows: Any, tmp: Path, data: st.DataObject) -> tuple[Path, str]:
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    text, how = garble(buf.getvalue(), data)
    p = _fresh(tmp, "rows.csv")
    raw = text.encode("utf-8", errors="surrogateescape")
    if data.draw(st.sampled_from([False] * 9 + [True]), label="latin-1 byte"):
        raw += b"\xff\xfe caf\xe9\n"
        how += " + non-UTF-8 bytes"
    p.write_bytes(raw)
    return p, how


def _lib_csv(path: Path, doc: Any) -> Any:
    from oracle.validate import read_rows, row_to_run
    rows = read_rows(path)
    for row in rows:
        check_lib(lambda row=row: row_to_run(row, path.parent), "row_to_run")
    return len(rows)


def _launch_seed() -> dict[str, Any]:
    """A Megatron-LM launch line as flag -> value (True: a bare flag; a list: several words; a NAME: an environment
    word), what ``project --megatron-args`` reads."""
    return {"--tensor-model-parallel-size": 2, "--pipeline-model-parallel-size": 1, "--expert-model-parallel-size": 4,
            "--micro-batch-size": 1, "--global-batch-size": 16, "--seq-length": 1024, "--bf16": True,
            "--recompute-granularity": "selective", "--recompute-modules": ["core_attn", "moe_act"],
            "--moe-token-dispatcher-type": "alltoall", "--cuda-graph-impl": "transformer_engine",
            "--cuda-graph-scope": ["attn"], "--use-distributed-optimizer": True, "NVTE_FUSED_ATTN": 1}


def _launch_line(doc: Any) -> str:
    if not isinstance(doc, dict):
        return str(doc)
    env, words = [], []  # environment words first: after a flag a word is its value
    for k, v in doc.items():
        k = str(k)
        if not k.startswith("-"):
            env.append(f"{k}={v}")
        elif v is True:
            words.append(k)
        else:
            words += [k, *(map(str, v) if isinstance(v, list) else [str(v)])]
    return " ".join(env + words)


def _launch_argv(path: Path, tmp: Path) -> list[str]:
    return ["project", "--model", "tiny-moe", "--hardware", "h100-sxm", "--num-gpus", "8",
            "--megatron-args=" + _text_of(path), "--format", "json"]


def _lib_launch(path: Path, doc: Any) -> Any:
    from oracle.recipe import read_recipe, split_megatron_args
    return read_recipe(split_megatron_args(_text_of(path)))


def _sets_seed() -> dict[str, Any]:
    """``--set KEY=VALUE`` overrides of a file-less tune (training keys, bare or dotted)."""
    return {"training.tp": 2, "pp": 1, "training.recompute": "selective", "mbs": 1, "cluster.memory_margin": 0.1}


def _sets_text(doc: Any) -> str:
    return "\n".join([f"{k}={v}" for k, v in doc.items()] if isinstance(doc, dict) else [str(doc)])


def _sets_of(path: Path) -> list[str]:
    return _text_of(path).split("\n")


def _sets_argv(path: Path, tmp: Path) -> list[str]:
    return ["tune", "--model", "tiny-moe", "--hardware", "h100-sxm", "--num-gpus", "8", "--seq-len", "1024", "--gbs",
            "16", "--driver", "inprocess", "--budget", "1", "--quiet", "--format", "json", "--fresh", "--results",
            str(path.parent / "results"), *(w for s in _sets_of(path) for w in ("--set", s))]


def _lib_sets(path: Path, doc: Any) -> Any:
    from searchers.derive import derive_spec
    return derive_spec(model="tiny-moe", hardware="h100-sxm", num_gpus=8, seq_len=1024, gbs=16, sets=_sets_of(path))


def kinds() -> dict[str, Kind]:
    """Every fuzzed input kind by name."""
    hw_seed = lambda: _load_yaml("hardware/h100-sxm.yaml")  # noqa: E731
    return {
        "config": Kind("config", _config_seed, _write_yaml("config.yaml"),
                       lambda p, tmp: ["project", str(p), "--format", "json"], _lib_config),
        "config-inline-card": Kind("config-inline-card", _inline_config_seed, _write_yaml("config.yaml"),
                                   lambda p, tmp: ["project", str(p), "--format", "json"], _lib_config),
        "config-recipe": Kind("config-recipe", _recipe_config_seed, _write_yaml("config.yaml"),
                              lambda p, tmp: ["project", str(p), "--format", "json"], _lib_config),
        "experiment": Kind("experiment", lambda: _load_yaml("experiments/tiny-moe-h100-8.yaml"),
                           _write_yaml("experiment.yaml"),
                           lambda p, tmp: ["tune", str(p), "--driver", "inprocess", "--budget", "1", "--quiet",
                                           "--format", "json", "--fresh", "--results", str(p.parent / "results")],
                           _lib_experiment, examples=20),
        "hardware": Kind("hardware", hw_seed, _write_yaml("profile.yaml"),
                         lambda p, tmp: ["hardware", "show", str(p)], _lib_hardware),
        "model-card": Kind("model-card", lambda: _load_yaml("oracle/models/mixtral-8x7b.yaml"),
                           _write_yaml("card.yaml"), lambda p, tmp: ["models", "show", str(p)], _lib_card),
        "hf-config": Kind("hf-config", lambda: json.loads((ROOT / "tests/fixtures/hf/mixtral-8x7b/config.json")
                                                          .read_text()),
                          _write_json, lambda p, tmp: ["models", "import", str(p)], _lib_hf),
        "hf-config-mla": Kind("hf-config-mla", lambda: json.loads((ROOT / "tests/fixtures/hf/deepseek-v3/config.json")
                                                                  .read_text()),
                              _write_json, lambda p, tmp: ["models", "import", str(p)], _lib_hf),
        "hf-config-wrapped": Kind("hf-config-wrapped", lambda: json.loads((ROOT / "tests/fixtures/hf/llama-4-maverick/"
                                                                           "config.json").read_text()),
                                  _write_json, lambda p, tmp: ["models", "import", str(p)], _lib_hf),
        "hf-config-nested": Kind("hf-config-nested", lambda: json.loads((ROOT / "tests/fixtures/hf/dbrx-base/config.json")
                                                                        .read_text()),
                                 _write_json, lambda p, tmp: ["models", "import", str(p)], _lib_hf),
        "hf-config-hybrid": Kind("hf-config-hybrid", lambda: json.loads((ROOT / "tests/fixtures/hf/"
                                                                         "nvidia-nemotron-3-nano-30b-a3b/config.json")
                                                                        .read_text()),
                                 _write_json, lambda p, tmp: ["models", "import", str(p)], _lib_hf),
        "model-card-hybrid": Kind("model-card-hybrid", lambda: _load_yaml("oracle/models/nemotronh-8b.yaml"),
                                  _write_yaml("card.yaml"), lambda p, tmp: ["models", "show", str(p)], _lib_card),
        "hf-config-gdn": Kind("hf-config-gdn", lambda: json.loads((ROOT / "tests/fixtures/hf/qwen3-next-80b-a3b/"
                                                                   "config.json").read_text()),
                              _write_json, lambda p, tmp: ["models", "import", str(p)], _lib_hf),
        "model-card-gdn": Kind("model-card-gdn", lambda: _load_yaml("oracle/models/qwen3-next-80b-a3b.yaml"),
                               _write_yaml("card.yaml"), lambda p, tmp: ["models", "show", str(p)], _lib_card),
        "csv": Kind("csv", _csv_seed, _write_csv, lambda p, tmp: ["validate", str(p), "--format", "json"], _lib_csv),
        "megatron-args": Kind("megatron-args", _launch_seed, _write_text("launch.txt", _launch_line), _launch_argv,
                              _lib_launch),
        "set-overrides": Kind("set-overrides", _sets_seed, _write_text("sets.txt", _sets_text), _sets_argv, _lib_sets,
                              examples=20),
    }


def run_case(kind: Kind, data: st.DataObject, tmp: Path) -> str:
    """One fuzz case of ``kind``: mutate, write, run the CLI and the library; return its description."""
    seed = kind.seed()
    doc, done = _mutate_csv(seed, data) if kind.name == "csv" else mutate(seed, data)
    path, how = kind.write(doc, tmp, data)
    case = f"{kind.name}: {'; '.join(done)}{'; ' + how if how else ''}"
    kind.tried += 1
    try:
        outcome = run_cli(kind.argv(path, tmp))
    except Exception as exc:  # escaped main(): a traceback for the user
        raise AssertionError(f"{case}: {type(exc).__name__} escaped the CLI: {exc!s:.500}") from exc
    check_cli(outcome, case)
    kind.results += outcome.rc == 0
    check_lib(lambda: kind.library(path, doc if kind.name != "csv" else None), case)
    return case
