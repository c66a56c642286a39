"""Loading configs: YAML files (+ ``_base_`` includes) -> dict -> dotted overrides -> typed dataclasses -> validate.

``load_config(path, overrides)`` checks every key and type and validates values. Every error
names the offending key and value, and unknown keys suggest close matches, so a typo never
silently falls back to a default. Numbers must be finite (no ``.nan``/``.inf``) and integers fit
in 64 bits, whatever the key.

YAML is read with ``load_yaml``: PyYAML's safe loader (no Python objects), after checking the
composed document's size *with aliases expanded*. A few anchors are fine, but a "billion laughs"
file (aliases of aliases, each level multiplying the size) is refused before anything walks it;
PyYAML itself shares aliased nodes, so the blow-up would hit later, when the config is merged,
validated or saved. Recursive aliases are refused too.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from mtl_cog.config.schema import Config
from mtl_cog.errors import ConfigError
from mtl_cog.io import atomic_write_text

MAX_YAML_NODES = 100_000  # nodes of a YAML document with its aliases expanded (a config has a few hundred)
MAX_YAML_BYTES = 1 << 20  # a config file is a few KB
INT64 = 2**63


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML ``text`` safely (see the module docstring); ``source`` names it in errors."""
    try:
        return _safe_load(text, source)
    except yaml.YAMLError as err:
        raise ConfigError(f"{source} is not valid YAML: {err}") from None


def _safe_load(text: str, source: str) -> Any:
    """``yaml.safe_load`` with the size checks; bad syntax stays a ``yaml.YAMLError``."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{source} is {len(text)} characters long; a config is at most {MAX_YAML_BYTES}.")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {}, set(), source)
        if size > MAX_YAML_NODES:
            raise ConfigError(f"{source} expands to more than {MAX_YAML_NODES} YAML nodes through its aliases "
                              "(*name): refused unread. Write the values out instead of aliasing aliases.")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int], source: str) -> int:
    """Nodes under ``node`` counting every alias as a copy (memoised: linear in the file, not the expansion)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise ConfigError(f"{source}: an alias refers to a node that contains it (a recursive structure).")
    open_nodes.add(key)
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, sizes, open_nodes, source) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, sizes, open_nodes, source) + _expanded_size(v, sizes, open_nodes, source)
                    for k, v in node.value)
    open_nodes.discard(key)
    sizes[key] = min(size, MAX_YAML_NODES + 1)  # the check only needs "too many"; keeps the numbers small
    return sizes[key]


def load_config(path: str | Path | Sequence[str | Path] | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated ``Config`` from optional YAML files and ``key=value`` overrides.

    Several files are merged in order, later ones winning key by key, exactly as ``_base_``
    includes are (``--data``/``--method`` and then each ``--config`` file: see ``compose``).
    """
    paths = [] if path is None else [path] if isinstance(path, (str, Path)) else list(path)
    raw: dict[str, Any] = {}
    for item in paths:
        _deep_merge(raw, _read_yaml_with_bases(Path(item)))
    for item in overrides or []:
        key, value = _parse_override(item)
        _set_dotted(raw, key, value)
    config = _build(Config, raw, prefix="")
    config.validate()
    return config


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Rebuild a config saved with ``Config.to_dict`` (e.g. a run folder's config.yaml)."""
    config = _build(Config, raw, prefix="")
    config.validate()
    return config


def save_config(config: Config, path: Path) -> None:
    atomic_write_text(path, yaml.safe_dump(config.to_dict(), sort_keys=False))


def _read_yaml_with_bases(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise ConfigError(f"config file {path} includes itself through _base_.")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path} cannot be read: {err}") from None
    data = load_yaml(text, f"config file {path}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at top level, got {type(data).__name__}.")
    bases = data.pop("_base_", [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) and b for b in bases):
        raise ConfigError(f"config file {path}: _base_ must be a file name or a list of file names. Got {bases!r}.")
    merged: dict[str, Any] = {}
    for base in bases:
        _deep_merge(merged, _read_yaml_with_bases(path.parent / base, _seen + (path.resolve(),)))
    _deep_merge(merged, data)
    return merged


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key != "timm_kwargs":
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. train.epochs=3).")
    key, text = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key.")
    try:
        value = _safe_load(text, f"override {item!r}") if text.strip() else ""
    except yaml.YAMLError:
        value = text  # not YAML: the text itself is the (string) value
    if isinstance(value, bool) and text.strip().lower() not in ("true", "false"):
        # YAML 1.1 reads yes/no/on/off as booleans: train.precision=no would be False, not the setting "no".
        # On a command line only true/false are booleans; a bool key given "yes" is refused by its type check.
        value = text.strip()
    return key, value


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {part!r} is a value, not a section.")
        node = child
    node[parts[-1]] = value


def _build(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping. Got {raw!r}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3)
            hint = f" Did you mean {', '.join(prefix + c for c in close)}?" if close else ""
            raise ConfigError(f"unknown config key {prefix + str(key)!r}.{hint} Known keys here: {', '.join(names)}.")
        kwargs[key] = _coerce(hints[key], value, prefix + key)
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, key: str) -> Any:
    """Check ``value`` against the type hint; allow int->float; name key and value on failure."""
    if dataclasses.is_dataclass(hint):
        return _build(hint, value if value is not None else {}, key + ".")
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}.")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list. Got {value!r}.")
        return [_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping. Got {value!r}.")
        return dict(value)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false. Got {value!r}.")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer. Got {value!r}.")
        if not -INT64 <= value < INT64:
            raise ConfigError(f"{key} must be an integer that fits in 64 bits. Got {value}.")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{key} must be a number. Got {value!r}.")
        try:
            # YAML 1.1 reads "1e-5" (no dot) as a string; accept it as the number it means.
            number = float(value)
        except OverflowError:  # an integer beyond the float range
            number = math.inf
        except ValueError:
            raise ConfigError(f"{key} must be a number. Got {value!r}.") from None
        if not math.isfinite(number):  # NaN or inf is never a setting: it would only poison training
            raise ConfigError(f"{key} must be a finite number. Got {value!r}.")
        return number
    if hint is str:
        if isinstance(value, bool):  # a YAML file's unquoted no/yes/on/off
            raise ConfigError(f"{key} must be a string. Got {value!r}: YAML reads an unquoted true, false, yes, "
                              f"no, on or off as a boolean; quote the word ('no').")
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string. Got {value!r}.")
        return value
    raise ConfigError(f"{key}: unsupported type {hint}.")


def with_overrides(config: Config, overrides: list[str] | None) -> Config:
    """``config`` with dotted ``key=value`` overrides on top, built and checked as ``load_config`` builds a file's
    (``--resume RUN key=value``: the run's saved config, read once, and the changed settings)."""
    if not overrides:
        return config
    raw = config.to_dict()
    for item in overrides:
        _set_dotted(raw, *_parse_override(item))
    return config_from_dict(raw)
