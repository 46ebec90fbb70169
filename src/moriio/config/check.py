"""Check a ``kv_connector_extra_config`` without an engine (``moriio doctor --config``).

Unlike start-up, which stops at the first problem, this lists every one it can: each unknown
key, each invalid value, then (once every value is valid) the keys that cannot work together.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moriio.config.keys import KNOWN_KEYS, env_notes, unknown_keys
from moriio.config.settings import (
    ConnectorSettings,
    parse_settings,
    settings_by_key,
    transport_choice,
)
from moriio.config.transport import HostFacts
from moriio.config.values import InvalidValueError, SettingsError


@dataclass(frozen=True, slots=True)
class ConfigReport:
    """``settings`` is None when there are ``errors``; ``warnings`` never stop start-up."""

    settings: ConnectorSettings | None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    summary: str = ""


def read_config_arg(text: str) -> dict[str, Any]:
    """A JSON object given inline or as ``@path``; a whole ``--kv-transfer-config`` is
    accepted too (its ``kv_connector_extra_config`` is checked). ValueError says why not."""
    source = text
    if text.startswith("@"):
        try:
            source = Path(text[1:]).read_text()
        except OSError as exc:
            raise ValueError(f"--config: cannot read {text[1:]!r}: {exc.strerror}") from None
    try:
        value = json.loads(source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--config is not valid JSON: {exc}") from None
    if isinstance(value, dict) and isinstance(value.get("kv_connector_extra_config"), dict):
        value = value["kv_connector_extra_config"]
    if not isinstance(value, dict):
        raise ValueError(f"--config must be a JSON object, got {type(value).__name__}")
    return value


def check_config(
    extra: Mapping[str, Any], environ: Mapping[str, str], facts: HostFacts | None = None
) -> ConfigReport:
    """Every problem of ``extra`` on this host, or the settings it gives."""
    errors = unknown_keys(extra)
    known = {k: v for k, v in extra.items() if k in KNOWN_KEYS}
    for key, value in known.items():
        try:
            parse_settings({key: value}, facts=facts)
        except InvalidValueError as exc:
            errors.append(str(exc))
        except SettingsError:
            pass  # needs the other keys: judged with them below
    if errors:
        return ConfigReport(None, errors)
    try:
        settings = parse_settings(known, facts=facts)
    except SettingsError as exc:
        return ConfigReport(None, [str(exc)])
    summary = (
        f"valid: transport {settings.transport.value} ({transport_choice(known, facts)}), "
        f"{settings.mode.value} mode"
    )
    warnings = env_notes(environ, settings_by_key(settings))
    return ConfigReport(settings, [], warnings, summary)
