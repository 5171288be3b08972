"""Every sub-command documents every argument, and the search commands are defined once."""
from __future__ import annotations

import argparse

import pytest

from raytune_primus.cli import build_parser
from raytune_primus.jobs import build_parser as build_job_parser


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:  # argparse keeps sub-commands here; there is no public accessor
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _undocumented(p: argparse.ArgumentParser) -> list[str]:
    text = p.format_help()
    out = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = a.option_strings[0] if a.option_strings else a.dest
        if not a.help or a.help == argparse.SUPPRESS:
            out.append(f"{name}: no help text")
        elif not any(x in text for x in (name, a.metavar or a.dest,
                                         "{" + ",".join(map(str, a.choices)) + "}" if a.choices else name)):
            out.append(f"{name}: not in --help")
    return out


COMMANDS = sorted(_subparsers(build_parser()))


@pytest.mark.parametrize("command", COMMANDS)
def test_every_argument_of_every_subcommand_has_help(command):
    sub = _subparsers(build_parser())[command]
    assert not _undocumented(sub), f"raytune-primus {command}: " + "; ".join(_undocumented(sub))
    for name, nested in _subparsers(sub).items():
        assert not _undocumented(nested), f"raytune-primus {command} {name}: " + "; ".join(_undocumented(nested))


def test_the_job_entry_point_documents_every_argument():
    assert not _undocumented(build_job_parser())


def _options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in p._actions for s in a.option_strings if s not in ("-h", "--help")}


def test_tune_compare_and_the_job_share_one_definition():
    subs = _subparsers(build_parser())
    tune, compare, job = _options(subs["tune"]), _options(subs["compare"]), _options(build_job_parser())
    # the job runs on Ray (no --driver) and picks tune or compare with --compare; otherwise the same options
    assert set(job) == (set(tune) | set(compare) | {"--compare"}) - {"--driver"}
    for opt in set(job) & (set(tune) | set(compare)):
        a, b = job[opt], tune.get(opt) or compare[opt]
        assert (a.default, a.help, a.nargs, a.choices) == (b.default, b.help, b.nargs, b.choices), opt
    assert tune["--driver"].default == compare["--driver"].default == "ray"


def test_searcher_names_in_the_help_come_from_the_registry(monkeypatch):
    from searchers import base
    monkeypatch.setattr(base, "available", lambda: ["alpha", "beta"])
    tune = _options(_subparsers(build_parser())["tune"])
    assert "alpha | beta" in tune["--searcher"].help


def test_bad_values_are_one_line_usage_errors(capsys):
    for argv in (["tune", "x", "--max-failures", "-1"], ["compare", "x", "--seeds", "0"],
                 ["compare", "x", "--seeds", "2", "--seed-list", "1"]):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--max-failures must be a non-negative integer" in err and "not allowed with argument" in err
