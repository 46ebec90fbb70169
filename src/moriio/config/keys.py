"""Which ``kv_connector_extra_config`` keys exist, and what the environment may still say.

An unknown key stops start-up naming it (and the nearest known key): a typo must not quietly
change the transfer mode or a timeout. The in-tree vLLM MoRIIO connector's keys are moriio's
own under the same names, except the ones in :data:`IN_TREE_REFUSED`, which name the key to
use instead. Its environment variables are ignored, with a warning naming the key to set.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from moriio.config.values import SettingsError

KNOWN_KEYS = frozenset(
    {
        "read_mode",
        "load_mode",
        "layer_barrier",
        "same_host_copies",
        "kv_cache_layout",
        "transport",
        "backend",
        "host_ip",
        "listen_host",
        "handshake_port",
        "notify_port",
        "qp_per_transfer",
        "post_batch_size",
        "num_workers",
        "transfer_timeout",
        "defer_timeout",
        "clock_skew_allowance",
        "quarantine_timeout",
        "liveness_timeout",
        "handshake_timeout",
        "handshake_retry_after",
        "handshake_max_retry_after",
        "trusted_remote_hosts",
        "shared_secret_env",
        "shared_secret_file",
        "chaos_seed",
        "progress_interval",
        "idle_step_wait",
        "proxy_ip",
        "proxy_ping_port",
        "proxy_ping_interval",
        "http_port",
    }
)

# Keys other connectors or tools put in the same config that mean nothing here: accepted and
# unused. None known today (vLLM adds no key of its own to a connector's extra config).
COMPAT_IGNORED_KEYS: frozenset[str] = frozenset()

# The in-tree connector's keys that moriio does not take, and what to set instead.
IN_TREE_REFUSED: Mapping[str, str] = {
    "recv_abort_timeout": (
        "transfer_timeout (moriio bounds every transfer, READs included, by transfer_timeout; "
        "it must stay below defer_timeout less clock_skew_allowance)"
    ),
}

# The in-tree connector's environment variables: ignored by both connectors, each with the
# key that replaces it.
DEPRECATED_ENV_VARS: Mapping[str, str] = {
    "VLLM_MORIIO_CONNECTOR_READ_MODE": "read_mode",
    "VLLM_MORIIO_QP_PER_TRANSFER": "qp_per_transfer",
    "VLLM_MORIIO_POST_BATCH_SIZE": "post_batch_size",
    "VLLM_MORIIO_NUM_WORKERS": "num_workers",
    "VLLM_MORIIO_TRANSFER_TIMEOUT_S": "transfer_timeout",
}


def check_keys(extra: Mapping[str, Any]) -> None:
    """Refuse any key moriio does not know, naming it and the nearest known key."""
    problems = unknown_keys(extra)
    if problems:
        raise SettingsError("kv_connector_extra_config: " + "; ".join(problems))


def unknown_keys(extra: Mapping[str, Any]) -> list[str]:
    """Each unknown key, with what to set instead (a did-you-mean, or the moriio key)."""
    problems: list[str] = []
    unknown = (k for k in extra if k not in KNOWN_KEYS and k not in COMPAT_IGNORED_KEYS)
    for key in sorted(map(str, unknown)):
        if key in IN_TREE_REFUSED:
            problems.append(
                f"{key} is the in-tree MoRIIO connector's key, not moriio's: "
                f"set {IN_TREE_REFUSED[key]}"
            )
        else:
            problems.append(_with_suggestion(key))
    return problems


def _with_suggestion(key: str) -> str:
    near = difflib.get_close_matches(key.strip().lower(), sorted(KNOWN_KEYS), n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"unknown key {key}{hint}"


def env_notes(environ: Mapping[str, str], effective: Mapping[str, object]) -> list[str]:
    """One warning per in-tree environment variable set: ignored, the key to use, and whether
    its value disagrees with what this engine will do (``effective``: key -> value)."""
    notes = []
    for variable, key in sorted(DEPRECATED_ENV_VARS.items()):
        if variable not in environ:
            continue
        value = environ[variable]
        note = (
            f"{variable}={value!r:.40} is ignored (deprecated); set "
            f"kv_connector_extra_config.{key} instead"
        )
        if key in effective and not _agrees(value, effective[key]):
            note += f"; it conflicts with the configuration, which runs {key}={effective[key]!r}"
        notes.append(note)
    return notes


def _agrees(text: str, value: object) -> bool:
    """Whether an environment string says the same as a parsed setting."""
    raw = text.strip().lower()
    if isinstance(value, bool):
        return raw in (("true", "1", "yes", "on") if value else ("false", "0", "no", "off", ""))
    if not isinstance(value, int | float):
        return raw == str(value).lower()
    try:
        return float(raw) == float(value)
    except ValueError:
        return False
