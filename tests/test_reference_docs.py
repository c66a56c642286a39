"""docs/reference/ is generated from the code (mtl_cog/cli/generate_reference.py) and fails here when it drifts."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from mtl_cog.cli import generate_reference
from mtl_cog.cli.main import COMMANDS
from mtl_cog.config import reference
from mtl_cog.config.schema import Config


def dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        keys += dotted_keys(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [f"{prefix}{key}"]
    return keys


def test_the_reference_pages_are_as_generated():
    stale = generate_reference.stale_pages()
    assert stale == [], f"{[str(p) for p in stale]} differ from the code: run python scripts/generate_reference.py"


def test_every_command_flag_and_config_key_is_on_its_page():
    pages = generate_reference.pages()
    commands, config = pages[generate_reference.REFERENCE / "commands.md"], pages[generate_reference.REFERENCE /
                                                                                 "config.md"]
    assert re.findall(r"^## (\S+)$", commands, re.M) == list(COMMANDS)
    for name in set(COMMANDS) - set(generate_reference.PASSTHROUGH):
        parser = generate_reference.command_parser(name)
        for action in parser._actions:
            flags = action.option_strings
            assert action.dest == "help" or action.help == argparse.SUPPRESS or all(  # a deprecated alias: hidden
                f"`{flag}" in commands for flag in flags), (name, flags)
    for key in dotted_keys(Config().to_dict()):
        assert f"| `{key}` |" in config, key
    assert "| `optim.leader_lr` | `float` | `0.0001` |" in config
    assert "| `--summary-bins` | `SUMMARY_BINS` | `15` | bin count shown in summary.md" in commands


def blank_descriptions(cls: type = Config) -> list[str]:
    """The config keys whose reference row says nothing (no comment above the field or at its line's end)."""
    return [key for _, _, rows in reference.config_keys(cls) for key, _, _, text in rows if not text.strip()]


def test_every_config_key_is_described():
    assert blank_descriptions() == [], "add a comment above these fields in mtl_cog/config/schema.py"


@dataclasses.dataclass
class HalfDescribed:
    # a comment above the field describes it
    above: int = 1
    trailing: int = 2  # so does one at the end of its line
    silent: int = 3


def test_a_blank_description_is_found():
    assert blank_descriptions(HalfDescribed) == ["silent"]


def test_check_finds_a_drifted_page(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(generate_reference, "REFERENCE", tmp_path)
    monkeypatch.setattr(generate_reference, "REPO", tmp_path.parent)
    assert generate_reference.main([]) == [] and generate_reference.main(["--check"]) == []
    page = tmp_path / "config.md"
    page.write_text(page.read_text().replace("`0.0001`", "`0.001`"))
    assert generate_reference.main(["--check"]) == [page]
    assert "config.md is not as generated" in capsys.readouterr().out


def test_a_command_without_a_parser_is_named(monkeypatch):
    class Silent:
        __doc__ = "A command that parses nothing."

        @staticmethod
        def main(argv):
            return None

    monkeypatch.setitem(COMMANDS, "silent", Silent)
    with pytest.raises(Exception, match="mtl-cog silent: no argparse parser"):
        generate_reference.command_parser("silent")
