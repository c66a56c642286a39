"""Loading configs: YAML (+ ``_base_`` includes) -> dict -> dotted overrides -> typed dataclasses -> validate.

``load_config(path, overrides)`` checks every key and type and validates values. Every error
names the offending key and value, and unknown keys suggest close matches, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from mtl_cog.config.schema import Config
from mtl_cog.errors import ConfigError
from mtl_cog.io import atomic_write_text


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated ``Config`` from an optional YAML file and ``key=value`` overrides."""
    raw: dict[str, Any] = _read_yaml_with_bases(Path(path)) if path is not None else {}
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
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at top level, got {type(data).__name__}.")
    bases = data.pop("_base_", [])
    if isinstance(bases, str):
        bases = [bases]
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
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
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
        return value
    if hint is float:
        if isinstance(value, str):
            # YAML 1.1 reads "1e-5" (no dot) as a string; accept it as the number it means.
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number. Got {value!r}.")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string. Got {value!r}.")
        return value
    raise ConfigError(f"{key}: unsupported type {hint}.")
