"""``moriio bench --stepped``: the routes per connector, one case driven against stand-in
engines over real pipes, and the summary's medians and verdicts."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import Any

import pytest

from moriio.cli.main import main
from moriio.domain.params.request_ids import transfer_id_from_request_id
from moriio.domain.values.addresses import ControlAddress
from moriio_tools.engines.protocol import EngineSnapshot, Finished, FirstToken, Submit
from moriio_tools.stepped.bench import SteppedConfig, answer_all
from moriio_tools.stepped.pair import Routes, SteppedCase, SteppedRun, parse_cores, run_case
from moriio_tools.stepped.report import render_stepped, summarize

CONTROLS = (ControlAddress("127.0.0.1", 7001, 7002), ControlAddress("127.0.0.1", 7003, 7004))


def test_moriio_write_sends_both_legs_at_once_with_one_transfer_id() -> None:
    rid, prefill, decode = Routes("write", CONTROLS).first_legs()
    tid = transfer_id_from_request_id(rid)
    assert tid is not None
    assert prefill["transfer_id"] == tid
    assert prefill["do_remote_decode"] is True
    assert prefill["remote_handshake_port"] == 7003  # where the prefill pushes: the decode
    assert decode is not None
    assert decode["transfer_id"] == tid
    assert decode["do_remote_prefill"] is True
    assert decode["remote_handshake_port"] == 7001


def test_moriio_read_decodes_with_what_the_prefill_returned() -> None:
    routes = Routes("read", CONTROLS)
    rid, _, decode = routes.first_legs()
    assert decode is None  # only once the prefill answered
    params = routes.decode_params(rid, {"remote_block_ids": [5, 6], "remote_engine_id": "p"})
    assert params["remote_block_ids"] == [5, 6]
    assert params["do_remote_prefill"] is True
    assert params["transfer_id"] == transfer_id_from_request_id(rid)


def test_nixl_gets_the_toy_proxys_legs() -> None:
    routes = Routes("nixl", CONTROLS)
    _, prefill, decode = routes.first_legs()
    assert prefill["do_remote_decode"] is True
    assert decode is None
    returned = {"remote_engine_id": "e", "remote_block_ids": [1]}
    assert routes.decode_params("any", returned) == returned


@dataclass
class FakeEngine:
    """A stand-in engine on a real pipe, speaking the engine processes' events: the prefill
    answers ``params``; the decode answers the prompt's first tokens and counts a load per
    request, unless ``lost`` names it."""

    role: str
    connection: Connection
    far: Connection
    lost: set[int] = field(default_factory=set)
    name: str = "stand-in"
    loads: int = 0
    sources: dict[str, int] = field(
        default_factory=lambda: {"external_kv_transfer": 0, "local_compute": 0}
    )
    in_flight: int = 0
    most_in_flight: int = 0
    finished: list[Finished] = field(default_factory=list)
    first_tokens: list[FirstToken] = field(default_factory=list)

    def submit(self, requests: list[Submit]) -> None:
        for request in requests:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            threading.Thread(target=self._answer, args=(request,)).start()

    def _answer(self, request: Submit) -> None:
        key, prompt = request.key, request.prompt
        if self.role == "prefill":
            self.far.send(Finished(key, prompt[:1], {"remote_block_ids": [1]}, "length", 1.0))
        elif prompt[0] not in self.lost:
            self.loads += 1
            self.sources["external_kv_transfer"] += len(prompt)
            self.far.send(FirstToken(key, 2.0))
            self.far.send(Finished(key, prompt[: request.max_tokens], None, "length", 3.0))
        self.in_flight -= 1

    def pump(self) -> None:
        while self.connection.poll():
            event = self.connection.recv()
            target: list[Any] = self.finished if isinstance(event, Finished) else self.first_tokens
            target.append(event)

    def take_finished(self) -> list[Finished]:
        out, self.finished = self.finished, []
        return out

    def take_first_tokens(self) -> list[FirstToken]:
        out, self.first_tokens = self.first_tokens, []
        return out

    def snapshot(self, settle_timeout_s: float = 10.0) -> EngineSnapshot:
        return EngineSnapshot(
            self.name, 0, 0, 0, {}, {}, (), True, dict(self.sources), loaded_requests=self.loads
        )


@dataclass
class FakePair:
    connector: str
    routes: Routes
    prefill: FakeEngine
    decode: FakeEngine


def _engine(role: str, lost: set[int] | None = None) -> FakeEngine:
    near, far = Pipe()
    return FakeEngine(role, near, far, lost or set())


@pytest.fixture
def case() -> SteppedCase:
    return SteppedCase("short-4", tuple((n, n + 1, n + 2) for n in range(10)), 4)


@pytest.mark.parametrize("mode", ["read", "write", "nixl"])
def test_a_case_runs_every_prompt_and_checks_it(mode: str, case: SteppedCase) -> None:
    pair = FakePair(f"c-{mode}", Routes(mode, CONTROLS), _engine("prefill"), _engine("decode"))
    reference = [p[:2] for p in case.prompts]
    reference[3] = (0, 0)  # one answer differs from the reference
    run, answers = run_case(pair, case, 2, reference, 0, idle_timeout_s=5.0)
    assert answers == [p[:2] for p in case.prompts]
    assert (run.requests, run.equal, run.failures, run.loaded) == (10, 9, 0, 10)
    assert len(run.ttft_s) == 10
    # The stand-ins stamp the prefill's end at 1.0 and the decode's first token at 2.0.
    assert run.handoff_s == [1.0] * 10
    assert [round(t - p, 9) for t, p in zip(run.ttft_s, run.prefill_s, strict=True)] == [1.0] * 10
    assert pair.decode.most_in_flight <= 4


def test_a_request_that_never_answers_fails_once_the_engines_fall_silent(
    case: SteppedCase,
) -> None:
    pair = FakePair("c", Routes("write", CONTROLS), _engine("prefill"), _engine("decode", {9}))
    run, answers = run_case(pair, case, 2, None, 0, idle_timeout_s=0.5)
    assert answers[9] is None
    assert (run.equal, run.failures, run.loaded) == (9, 1, 9)


def _run(
    connector: str,
    case: str,
    rps: float,
    ttft: float,
    round_index: int = 0,
    binding: str = "own-cores",
    cpu: float = 0.5,
) -> SteppedRun:
    prefill = [ttft / 4000] * 8  # a quarter of each TTFT on the prefill, the rest handed off
    handoff = [3 * ttft / 4000] * 8
    usage = {role: {"cpu": cpu, "wakeups_per_s": 100.0 * cpu} for role in ("prefill", "decode")}
    return SteppedRun(
        connector,
        case,
        round_index,
        8,
        8,
        0,
        8 / rps,
        None,
        [ttft / 1000] * 8,
        loaded=8,
        prefill_s=prefill,
        handoff_s=handoff,
        binding="" if connector in ("baseline", "prefill-alone") else binding,
        usage={} if connector in ("baseline", "prefill-alone") else usage,
    )


def test_the_summary_takes_medians_and_sets_the_better_mode_against_the_peer() -> None:
    runs = [
        _run("moriio-read", "long-4", 2.0, 300.0),
        _run("moriio-read", "long-4", 4.0, 100.0, 1),
        _run("moriio-write", "long-4", 4.0, 150.0),
        _run("moriio-write", "long-4", 4.0, 150.0, 1),
        _run("nixl-progress-off", "long-4", 2.0, 200.0),
        _run("nixl-progress-off", "long-4", 2.0, 200.0, 1),
    ]
    summary = summarize(runs)["own-cores"]["cases"]["long-4"]
    assert summary["connectors"]["moriio-read"]["requests_per_s"] == pytest.approx(3.0)
    assert summary["connectors"]["moriio-read"]["ttft_p50_ms"] == pytest.approx(200.0)
    assert summary["connectors"]["moriio-read"]["equal"] == 16
    assert summary["connectors"]["moriio-read"]["prefill_p50_ms"] == pytest.approx(50.0)
    assert summary["connectors"]["moriio-read"]["handoff_p50_ms"] == pytest.approx(150.0)
    verdict = summary["verdict"]
    assert verdict["best"] == "moriio-write"
    assert verdict["requests_per_s_ratio"] == pytest.approx(2.0)
    assert verdict["ttft_p50_ratio"] == pytest.approx(0.75)
    assert summary["connectors"]["moriio-read"]["usage"]["decode"]["cpu"] == pytest.approx(0.5)
    table = render_stepped({"summary": summarize(runs)})
    assert "moriio-write vs nixl-progress-off: req/s x2.00, TTFT p50 x0.75" in table
    assert "peer: NixlConnector at vLLM's defaults (kv_connector_extra_config" in table
    assert "== own-cores: each engine pinned to its own cores" in table
    # CPU and wake-ups: the prefill's and the decode's summed
    assert (
        "moriio-write        16/16       16      4.00       150       38       112      1.00"
        "         100" in table
    )


def test_each_binding_gets_its_table_with_the_references_and_its_idle_figures() -> None:
    runs = [
        _run("baseline", "short-4", 30.0, 20.0),
        _run("moriio-read", "short-4", 20.0, 30.0, binding="vllm-defaults"),
        _run("nixl-progress-off", "short-4", 10.0, 40.0, binding="vllm-defaults"),
        _run("moriio-read", "short-4", 25.0, 25.0, binding="unbound-1"),
        _run("nixl-progress-off", "short-4", 20.0, 30.0, binding="unbound-1"),
    ]
    idle = [
        {
            "binding": "unbound-1",
            "connector": connector,
            "engines": {
                role: {
                    "seconds": 30.0,
                    "cpu": cpu,
                    "wakeups_per_s": 2.0,
                    "threads": [
                        {"name": name, "count": 1, "cpu": 0.0, "wakeups_per_s": 1.0}
                        for name in ("main", thread)
                    ],
                }
                for role in ("prefill", "decode")
            },
        }
        for connector, cpu, thread in (
            ("moriio-read", 0.001, "moriio-progress"),
            ("nixl-progress-off", 0.002, "nixl_handshake_listener"),
        )
    ]
    summary = summarize(runs, idle)
    assert list(summary) == ["vllm-defaults", "unbound-1"]
    for binding, ratio in (("vllm-defaults", 2.0), ("unbound-1", 1.25)):
        entry = summary[binding]["cases"]["short-4"]
        assert list(entry["connectors"]) == ["baseline", "moriio-read", "nixl-progress-off"]
        assert entry["verdict"]["requests_per_s_ratio"] == pytest.approx(ratio)
    assert summary["vllm-defaults"]["idle"] == []
    assert [e["connector"] for e in summary["unbound-1"]["idle"]] == [
        "moriio-read",
        "nixl-progress-off",
    ]
    table = render_stepped({"summary": summary, "inherited_env": {"OMP_NUM_THREADS": "3"}})
    assert "every engine inherits {'OMP_NUM_THREADS': '3'}" in table
    assert "== vllm-defaults: vLLM's defaults: nothing set" in table
    assert "== unbound-1: engines unbound, one OpenMP thread each (OMP_NUM_THREADS=1) ==" in table
    assert "idle 30 s, peers connected, no request" in table
    assert "  moriio-read        CPU 0.0010 / 0.0010, wake-ups/s 2.0 / 2.0" in table
    assert "prefill: main 1.0/s, nixl_handshake_listener 1.0/s" in table


def test_unknown_connectors_are_refused() -> None:
    with pytest.raises(ValueError, match="nixl-default"):
        SteppedConfig(connectors=("nixl-default",))


def test_the_command_refuses_a_connector_it_cannot_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--stepped", "--connectors", "moriio-read,nixl-default"]) == 2
    assert "nixl-default" in capsys.readouterr().err


def test_one_engine_answers_every_prompt_with_a_bounded_number_in_flight(
    case: SteppedCase,
) -> None:
    engine = _engine("decode")
    answers, run = answer_all(engine, "baseline", case, 2, timeout=5.0)
    assert answers == [p[:2] for p in case.prompts]
    assert (run.connector, run.requests, run.equal, len(run.ttft_s)) == ("baseline", 10, 10, 10)
    assert engine.most_in_flight <= case.concurrency


def test_a_prefill_bound_case_is_set_against_the_prefill_alone_limit() -> None:
    runs = [
        _run("prefill-alone", "mixed-128", 50.0, 1.0),
        _run("baseline", "mixed-128", 40.0, 700.0),
        _run("moriio-write", "mixed-128", 45.0, 900.0),
    ]
    summary = summarize(runs)["own-cores"]["cases"]["mixed-128"]
    assert summary["connectors"]["moriio-write"]["vs_prefill_alone"] == pytest.approx(0.9)
    assert summary["verdict"] == {"best": "moriio-write", "ttft_over_baseline_ms": 200.0}
    table = render_stepped({"summary": summarize(runs)})
    assert "0.90" in table
    assert "moriio-write: TTFT p50 +200 ms over baseline" in table


@pytest.mark.parametrize(
    ("bind", "cores"),
    [("nobind", ()), ("all", ()), ("1", (1,)), ("0,1", (0, 1)), ("0-2,5", (0, 1, 2, 5))],
)
def test_an_engines_cores_are_read_from_its_thread_binding(
    bind: str, cores: tuple[int, ...]
) -> None:
    assert parse_cores(bind) == cores
