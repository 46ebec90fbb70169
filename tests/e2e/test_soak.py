"""``moriio bench --soak`` on a real 1P1D ``vllm serve`` deployment behind ``moriio router``
under bursts, idle gaps, cancels and engine kills, READ then WRITE.

Runs :func:`moriio_tools.harness.run_soak`, the function behind the command, and checks
its records: every answer equals a single plain engine's, no block is held at an interval's
quiet end, the prefill and the decode engine were each killed and restarted at least once,
with the requests after each restart answered correctly and their prompt KV moved over the
wire. By default it runs two minutes of traffic (one kill per mode); the long form,
``MORIIO_SOAK_SECONDS=480`` (or more), also judges every engine incarnation's RSS and
descriptor slopes, which need a survivor past its warm-up. ``MORIIO_SOAK_KILL_EVERY``
overrides the kill interval.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moriio_tools.harness import (
    SOAK_ROLES,
    ServeDemoConfig,
    SoakConfig,
    build_prompts,
    interval_rows,
    run_soak,
    slope_failures,
    soak_header,
    soak_summary,
)
from support.llama_reference import LlamaReference
from support.prompt_kv import assert_prompt_kv_over_the_wire

SOAK_S = float(os.environ.get("MORIIO_SOAK_SECONDS", "120"))
# The long form: each mode's survivor lives past verdict.WARMUP_S + MIN_SLOPE_SPAN_S.
FULL_SOAK_S = 480.0
# One kill per mode, early enough for its recovery waves (in the long form, early enough
# that the survivor's series still spans the warm-up plus the judged span).
DEFAULT_KILL_EVERY_S = 150.0 if SOAK_S >= FULL_SOAK_S else SOAK_S / 4
KILL_EVERY_S = float(os.environ.get("MORIIO_SOAK_KILL_EVERY", DEFAULT_KILL_EVERY_S))
# Quiet samples every ~25 s (an interval ends with the step that crosses it): the survivor of
# each mode's kill has enough of them past its warm-up for its slopes to be judged.
INTERVAL_S = 20.0
# Start-ups (the reference engine, one deployment per mode) and overruns come on top.
SETUP_S = 1200

pytestmark = [pytest.mark.engine, pytest.mark.timeout(int(SOAK_S) + SETUP_S)]


def test_a_soak_answers_equal_leaks_nothing_and_survives_kills(
    llama_reference: LlamaReference, tmp_path: Path
) -> None:
    config = SoakConfig(
        duration_s=SOAK_S, interval_s=INTERVAL_S, kill_every_s=KILL_EVERY_S, log_dir=str(tmp_path)
    )
    # The session's reference engine answered the soak's pool too, with as many tokens.
    _, pool, expected = llama_reference.prompt_set("soak")
    assert build_prompts(config.pool, seed=config.seed) == pool
    assert config.max_tokens == ServeDemoConfig().max_tokens
    print(soak_header())
    result = run_soak(
        config,
        print,
        lambda interval: print(interval_rows(interval)),
        reference=dict(zip(pool, expected, strict=True)),
    )
    print("\n" + soak_summary(result))
    totals = result.totals()
    assert {iv.mode for iv in result.intervals} == {"read", "write"}
    assert totals["answered"] > 0
    assert totals["equal"] == totals["answered"], f"logs: {tmp_path}"
    assert totals["errors"] == 0, [iv.error_examples for iv in result.intervals if iv.errors]
    assert totals["cancelled"] > 0
    held = [(iv.index, s.engine, s.held_blocks) for iv in result.intervals for s in iv.engines]
    assert [h for h in held if h[2]] == []
    assert [f for s in result.slopes for f in slope_failures(s)] == []
    if SOAK_S >= FULL_SOAK_S:  # a shortened run may leave every series too short to judge
        assert {s.mode for s in result.slopes if s.judged} == {"read", "write"}
    assert {k.role for k in result.kills} == set(SOAK_ROLES)
    for kill in result.kills:
        assert kill.recovery > 0
        assert kill.recovery_equal == kill.recovery, kill
        # The requests after a restart (nothing else in flight): their prompt KV came over
        # the wire (cancels and kills leave the other waves' sources mixed).
        assert_prompt_kv_over_the_wire(
            kill.recovery_sources, kill.recovery_prompt_tokens, detail=kill
        )
    # The engine each kill replaced took part in what followed: a later quiet sample
    # shows its new incarnation holding nothing.
    for kill in result.kills:
        later = [
            s
            for iv in result.intervals
            if iv.mode == kill.mode and iv.t_s > kill.t_s
            for s in iv.engines
            if s.engine == kill.engine
        ]
        assert later, kill
        assert later[0].incarnation >= 1
    assert result.failures == []
