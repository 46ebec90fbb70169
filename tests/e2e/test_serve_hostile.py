"""A real 1P1D ``vllm serve`` deployment behind ``moriio router`` while an attacker on the same
host sends hostile requests to the engines' HTTP ports and forged, replayed and malformed frames
to their control ports, for the whole run. Every normal output must still equal a single plain
engine's, and both engines must end with no block held.

The attacker also takes a prompt's genuine hand-off (as a router would: the prefill leg sent
to the prefill's port) and sends it to the decode's port with another prompt, and (READ)
sends the decode guessed block ids under the prefill's engine id: both are refused, no KV
is loaded for them (the decode's ``prompt_tokens_by_source``), their answer is an error;
the prompt the hand-off was computed for still loads it over the wire (WRITE: under a
transfer of its own, as the refused request's end gave its transfer up).
"""

from __future__ import annotations

import json
import random
import threading
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zmq

from moriio.adapters.zmq import ZmqControlChannel, framing
from moriio.adapters.zmq.framing import Envelope, Kind
from moriio.domain.params.outgoing_params import decode_leg_params, prefill_leg_params
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Message, Release, RemoteBlocks, WriteDone, WriteFailed
from moriio.domain.values.addresses import ControlAddress
from moriio.ports import ControlChannelError, PeerAddress
from moriio_tools.harness import (
    Deployment,
    EngineSlot,
    Progress,
    Prompt,
    ServeDemoConfig,
    demo_runner_module,
    run_mode,
    total,
)
from support.llama_reference import LlamaReference
from support.prompt_kv import assert_prompt_kv_over_the_wire, summary_sources

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

HOST = "127.0.0.1"
CONCURRENT = 8
IDLE = 2
FORGED = "f" * 32
HOSTILE_PARAMS: list[Any] = [
    {"do_remote_prefill": True, "remote_host": "127.0.0.1 ", "remote_block_ids": [[1, 2]]},
    {"do_remote_prefill": True, "remote_engine_id": {}, "transfer_id": "x"},
    {"do_remote_prefill": True, "remote_dp_rank": 10**6, "transfer_id": "x"},
    {"do_remote_prefill": True, "remote_tp_size": 10**9, "transfer_id": "x"},
    {"do_remote_decode": True, "transfer_id": "y" * 100_000},
    {"do_remote_prefill": True, "remote_notify_port": "\uff16\uff13\uff10\uff11"},
    {"do_remote_prefill": True, "remote_block_ids": [[True]], "lease_expires_at": 1e400},
]


def _tokens(rng: random.Random, n: int = 90) -> list[int]:
    """A prompt of random token ids: shares no block with any other prompt of the run (the
    demo model's word-level tokenizer would make random words one unknown token each)."""
    return [rng.randrange(10, 1000) for _ in range(n)]


class Attacker:
    """Sends hostile traffic to every engine until stopped; counts what it sent."""

    def __init__(self, deployments: list[Deployment], model: str, mode: str) -> None:
        self._deployments = deployments
        self._model = model
        self._mode = mode
        self._stop = threading.Event()
        self.sent: Counter[str] = Counter()
        self.decode_prompt_tokens = 0  # of the hostile requests the decode engine answered
        self.loaded_prompt_tokens = 0  # of the attacker's genuine hand-off, loaded by the decode
        self.hand_off_attacks: dict[str, int] = {}  # attack -> the decode's HTTP status
        self._rng = random.Random(53)
        self._thread = threading.Thread(target=self._run, name="attacker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _run(self) -> None:
        channel: ZmqControlChannel[Message] = ZmqControlChannel(WIRE_CODEC, HOST, 0)
        ctx = zmq.Context()
        try:
            while not self._stop.wait(0.05):
                if not self._deployments or not self._deployments[0].slots:
                    continue
                if not self.hand_off_attacks:
                    self._hand_off_attacks(self._deployments[0].slots)
                for slot in self._deployments[0].slots:
                    self._frames(channel, ctx, PeerAddress(HOST, slot.notify_port))
                    self._request(slot.url, slot.role == "decode")
        finally:
            channel.close()
            ctx.term()

    def _frames(
        self, channel: ZmqControlChannel[Message], ctx: zmq.Context[Any], to: PeerAddress
    ) -> None:
        tid = f"tx-{self.sent['rounds']:08x}"
        self.sent["rounds"] += 1
        forged: list[Message] = [
            Release(tid),
            Release(tid, 2, 1, FORGED),
            WriteDone(tid, FORGED),
            WriteFailed(tid, "forged", FORGED),
            RemoteBlocks(tid, "r", (1, 2), 0, 0, 0, 1, PeerAddress(HOST, 9), "i", 4e9, FORGED),
        ]
        for message in forged * 2:  # each one replayed
            try:
                channel.send(to, message)
                self.sent["forged_frames"] += 1
            except ControlChannelError:
                self.sent["send_refused"] += 1
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://{to.host}:{to.port}")
        body = dict(WIRE_CODEC.encode(Release(tid)))
        body["transfer_id"] = {"nested": 1}
        for frames in (
            [b"\xc1garbage"],
            framing.encode(Envelope(Kind.MESSAGE, 0, None, body), None),
            framing.encode(Envelope(Kind.MESSAGE, 0, None, {**body, "v": 1}), None),
        ):
            sock.send_multipart(frames)
            self.sent["malformed_frames"] += 1
        sock.close(linger=200)

    def _post(
        self, url: str, prompt: list[int], max_tokens: int, params: dict[str, Any]
    ) -> tuple[int, Any]:
        payload = {"model": self._model, "prompt": prompt, "max_tokens": max_tokens}
        payload["kv_transfer_params"] = params
        request = urllib.request.Request(
            f"{url}/v1/completions",
            json.dumps(payload).encode(),
            {"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")[:300]

    def _hand_off(self, prefill: EngineSlot, decode: EngineSlot, prompt: list[int]) -> Any:
        """``prompt``'s prefill leg, sent as a router sends it; the decode leg's params."""
        p_address = ControlAddress(HOST, prefill.handshake_port, prefill.notify_port)
        d_address = ControlAddress(HOST, decode.handshake_port, decode.notify_port)
        sizes = {"dp_size": 1, "dp_rank": 0, "tp_size": 1}
        tid = uuid.uuid4().hex
        status, answer = self._post(
            prefill.url, prompt, 1, prefill_leg_params(tid, d_address, **sizes)
        )
        assert status == 200, answer
        returned = answer.get("kv_transfer_params") if self._mode == "read" else None
        return decode_leg_params(tid, returned, p_address, **sizes)

    def _hand_off_attacks(self, slots: list[EngineSlot]) -> None:
        """A prompt's genuine hand-off, taken from the prefill as a router takes it, sent to
        the decode with another prompt (and, READ, guessed block ids under the prefill's
        engine id); then with its own prompt, which loads it. WRITE: vLLM gives the decode's
        connector the params of a request it rejected, and the decode releases their
        transfer, so the prompt's own load goes under a transfer of its own."""
        prefill = next(s for s in slots if s.role == "prefill")
        decode = next(s for s in slots if s.role == "decode")
        prompt, other, guessed = (_tokens(self._rng) for _ in range(3))
        genuine = self._hand_off(prefill, decode, prompt)
        self.hand_off_attacks["replayed"] = self._post(decode.url, other, 2, genuine)[0]
        if self._mode == "read":
            engine_id = str(genuine["remote_engine_id"]).partition("#")[0]
            blocks = [list(range(1, len(genuine["remote_block_ids"][0]) + 1))]
            forged = {**genuine, "remote_engine_id": engine_id, "remote_block_ids": blocks}
            forged["transfer_id"] = uuid.uuid4().hex
            self.hand_off_attacks["guessed"] = self._post(decode.url, guessed, 2, forged)[0]
        else:
            genuine = self._hand_off(prefill, decode, prompt)
        status, answer = self._post(decode.url, prompt, 2, genuine)
        assert status == 200, (answer, self.hand_off_attacks)
        self.loaded_prompt_tokens += int(answer["usage"]["prompt_tokens"])

    def _request(self, url: str, decode: bool) -> None:
        """One hostile completion; a decode's answer adds its prompt tokens to
        ``decode_prompt_tokens`` (the decode computes them itself: no KV comes for them)."""
        params = HOSTILE_PARAMS[self.sent["requests"] % len(HOSTILE_PARAMS)]
        payload = {"model": self._model, "prompt": "hostile", "max_tokens": 2}
        payload["kv_transfer_params"] = params
        data = json.dumps(payload).encode()
        request = urllib.request.Request(
            f"{url}/v1/completions", data, {"Content-Type": "application/json"}
        )
        self.sent["requests"] += 1
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                self.sent[f"http_{response.status}"] += 1
                usage = json.loads(response.read()).get("usage") or {}
                if decode:
                    self.decode_prompt_tokens += int(usage.get("prompt_tokens", 0))
        except urllib.error.HTTPError as exc:
            self.sent[f"http_{exc.code}"] += 1
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            self.sent["http_unreachable"] += 1


@pytest.fixture(scope="module")
def reference(llama_reference: LlamaReference) -> tuple[Path, list[Prompt], list[Any]]:
    """The first prompts of the session's reference, with the plain engine's outputs."""
    model_dir, prompts, expected = llama_reference.prompt_set("deployment")
    return model_dir, prompts[: IDLE + CONCURRENT], expected[: IDLE + CONCURRENT]


@pytest.mark.parametrize("mode", ["read", "write"])
def test_hostile_traffic_during_a_serve_run_changes_no_output(
    reference: tuple[Path, list[Prompt], list[Any]],
    tmp_path: Path,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model_dir, prompts, expected = reference
    deployments: list[Deployment] = []

    class Recorded(Deployment):
        def start(self, progress: Progress) -> None:
            deployments.append(self)
            super().start(progress)

    monkeypatch.setattr(demo_runner_module, "Deployment", Recorded)
    attacker = Attacker(deployments, str(model_dir), mode)
    refused: dict[str, float] = {}

    def progress(line: str) -> None:
        if "idle phase" in line:
            attacker.start()
        elif "settling" in line:  # the requests are done: the run's traffic ends here
            attacker.stop()
            for slot in deployments[0].slots:
                samples = deployments[0].metrics(slot)
                refused[slot.role] = total(samples, "vllm:moriio_handoffs_refused_total")

    config = ServeDemoConfig(requests=CONCURRENT, idle_requests=IDLE, idle_gap_s=1.0)
    try:
        summary = run_mode(mode, model_dir, prompts, expected, config, tmp_path, progress)
    finally:
        attacker.stop()
    print(f"\n{mode}: attacker sent {dict(attacker.sent)}; summary {summary}")
    assert attacker.sent["forged_frames"] > 0
    assert attacker.sent["requests"] > 0
    assert not [k for k in attacker.sent if k.startswith("http_5")], attacker.sent
    assert summary["requests"] == IDLE + CONCURRENT
    assert summary["failures"] == 0, summary
    assert summary["mismatches"] == 0, summary
    assert summary["held_blocks_prefill"] == 0, summary
    assert summary["held_blocks_decode"] == 0, summary
    # The hand-off replayed for another prompt, and the guessed block ids, were refused with
    # an error (vLLM's default kv_load_failure_policy) by the engine that checks them.
    attacks = {"replayed": 500, **({"guessed": 500} if mode == "read" else {})}
    assert attacker.hand_off_attacks == attacks
    checker = "decode" if mode == "read" else "prefill"
    assert refused[checker] >= len(attacks), refused
    # The genuine requests' prompt KV came over the wire (and the attacker's own prompt's,
    # from its genuine hand-off); the decode computed only the hostile requests' prompts
    # (their parameters load nothing), and loaded nothing for the refused hand-offs.
    assert_prompt_kv_over_the_wire(
        summary_sources(summary),
        summary["prompt_tokens"] + attacker.loaded_prompt_tokens,
        computed=attacker.decode_prompt_tokens,
        detail=dict(attacker.sent),
    )
