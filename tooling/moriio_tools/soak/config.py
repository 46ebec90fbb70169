"""The soak's settings and the parsing of durations such as ``10m``, ``1h30m`` or ``600s``."""

from __future__ import annotations

import re
from dataclasses import dataclass

MODES = ("read", "write")
ROLES = ("prefill", "decode")  # the kill victims, in turn
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([hms]?)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}

# The longest an engine may take to give back every block once traffic stops: after a kill
# the survivor's transfers to the dead peer time out (transfer_timeout, 30 s by default) and
# stay quarantined (quarantine_timeout, 30 s), and a hand-off nobody takes waits out its lease
# (defer_timeout, 60 s): 150 s covers the longest chain with room to spare. In a healthy
# interval every block is back within a second; the bound only ends a wait that would fail.
QUIET_TIMEOUT_S = 150.0
# vLLM's HTTP server closes an idle keep-alive connection after 5 s: quiet points are taken at
# least this long after the last request, so that descriptor counts compare.
QUIET_MIN_S = 6.0


def parse_duration(text: str) -> float:
    """Seconds of ``text``: a number with an optional unit ``h``, ``m`` or ``s`` (seconds by
    default), or several such parts (``1h30m``); ValueError if it is none of those or 0."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"not a duration: {text!r} (examples: 600s, 10m, 1h, 1h30m)")
    units = [u for _, u in parts]
    if len(parts) > 1 and ("" in units or len(set(units)) != len(units)):
        raise ValueError(f"not a duration: {text!r} (each part needs its own unit: 1h30m)")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"a duration must be > 0, got {text!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """What the soak runs. The traffic time, ``duration_s``, is shared equally by the
    ``modes``, one after the other, each on a deployment of its own (the transfer mode is a
    connector setting); it includes kills, restarts and quiet waits, not start-ups."""

    duration_s: float
    interval_s: float = 60.0  # one report per interval
    kill_every_s: float = 180.0  # one engine SIGKILLed and restarted this often; 0: never
    burst: int = 128  # requests in flight at once
    pool: int = 64  # distinct prompts with reference outputs (one plain engine's)
    recovery: int = 16  # pool requests sent right after a restart
    normal_with_cancels: int = 8  # pool requests in flight alongside the abandoned ones
    cancels: int = 12  # clients that give up mid-request, per cancel wave
    cancel_prompt_len: int = 900
    cancel_max_tokens: int = 64
    trickle: int = 2  # pool requests sent one at a time, idle_gap_s apart, after a gap
    idle_gap_s: float = 3.0
    max_tokens: int = 16
    modes: tuple[str, ...] = MODES
    seed: int = 0
    log_dir: str | None = None
    model_cache_dir: str | None = None
    quiet_timeout_s: float = QUIET_TIMEOUT_S
    # With a fixed pool, prefix caching would make every request after the first round a
    # local cache hit on the decode engine, with nothing left to transfer: the soak turns it
    # off so that every answer crossed the connector.
    engine_args: tuple[str, ...] = ("--no-enable-prefix-caching",)
    # A burst of 128 on engines running 32 sequences queues at the decode for longer than the
    # default lease leaves a READ to start (defer_timeout 60 s less transfer_timeout 30 s and
    # the skew allowance): a deployment that sees such queues raises defer_timeout, as this
    # one does. It stays below the quiet wait, so a hand-off left to its lease still shows.
    defer_timeout_s: float = 120.0

    def validate(self) -> None:
        for mode in self.modes:
            if mode not in MODES:
                raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not self.modes:
            raise ValueError("at least one mode")
        if self.duration_s <= 0 or self.interval_s <= 0:
            raise ValueError("duration and interval must be > 0")
        if self.kill_every_s < 0:
            raise ValueError(f"kill interval must be >= 0, got {self.kill_every_s}")
        counts = (self.burst, self.pool, self.recovery, self.max_tokens, self.cancel_max_tokens)
        if min(counts) < 1:
            raise ValueError("burst, pool, recovery and token counts must be >= 1")
        if min(self.normal_with_cancels, self.cancels, self.trickle) < 0 or self.idle_gap_s < 0:
            raise ValueError("cancel and trickle counts and the idle gap must be >= 0")
        if not 1 <= self.cancel_prompt_len <= 1024 - self.cancel_max_tokens:
            raise ValueError("cancel_prompt_len + cancel_max_tokens must fit max_model_len 1024")

    @property
    def mode_s(self) -> float:
        """Traffic seconds of each mode."""
        return self.duration_s / len(self.modes)
