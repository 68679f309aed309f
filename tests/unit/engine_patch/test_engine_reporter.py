"""The reporter against a fake controller (httpx mock transport): delivery, retries, dedup, garbage, backoff."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest

from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
from specctl_vllm.engine_patch.reporter import Identity, Reporter
from specctl_vllm.engine_patch.settings import EngineSettings
from specctl_vllm.engine_patch.telemetry import StepQueue, StepRow, new_entry
from specctl_vllm.kernel import protocol

ENGINE = EngineSpec(method="ngram", k_max=4, model_free_methods=("suffix",))
TOKEN = "ing-0123456789abcdef"


def ack(seq: int, version: int = 3, ttl: float = 2.0, outcome: str = "accepted") -> dict:
    return {"outcome": outcome, "seq": seq, "gaps": 0,
            "policy": {"protocol": 1, "version": version, "issued_at": 1.0, "ttl_s": ttl,
                       "default": {"k": 2}, "categories": {"json": {"k": 1}}}}


class FakeController:
    """Answers from a script: each entry is a status + JSON body, or an exception to raise."""

    def __init__(self, script: list[Callable[[dict], httpx.Response] | Exception]) -> None:
        self.script = list(script)
        self.bodies: list[dict] = []
        self.headers: list[httpx.Headers] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        self.headers.append(request.headers)
        answer = self.script.pop(0) if self.script else (lambda b: httpx.Response(200, json=ack(b["seq"])))
        if isinstance(answer, Exception):
            raise answer
        return answer(body)


def ok(version: int = 3, ttl: float = 2.0, outcome: str = "accepted"):
    return lambda b: httpx.Response(200, json=ack(b["seq"], version, ttl, outcome))


def status(code: int, body: object = None):
    return lambda b: httpx.Response(code, json=body if body is not None else {"detail": "no"})


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def make(script, engine: EngineSpec = ENGINE, pause: Callable[[float], None] = lambda s: None,
         **settings) -> tuple[Reporter, FakeController, StepQueue, PolicyHolder,
                                                                  Clock]:
    fake = FakeController(script)
    queue = StepQueue(settings.pop("queue_steps", 100))
    holder = PolicyHolder(ENGINE)
    clock = Clock()
    cfg = EngineSettings.model_validate({"ingest_token": TOKEN, "report_interval_s": 0.1, **settings})
    identity = Identity(engine_id="host-dp0", boot_id="b00t", model_name="m", spec=engine.to_protocol())
    client = httpx.Client(transport=httpx.MockTransport(fake), headers={"authorization": f"Bearer {TOKEN}"})
    reporter = Reporter(cfg, queue, holder, identity, client=client, clock=clock, wall_clock=lambda: 1.7e9,
                        pause=pause)
    return reporter, fake, queue, holder, clock


def row(t: float = 1.0) -> StepRow:
    json_tally, default_tally = new_entry(), new_entry()
    json_tally.requests, json_tally.hists = 2, {2: [0, 1, 1]}
    json_tally.counterfactual, json_tally.attempts = {"suffix": {3: [1, 0, 0, 0]}}, {"suffix": 4}
    default_tally.requests = 1
    agg = {("json", "ngram"): json_tally, ("default", "off"): default_tally}
    return StepRow(t=t, wall_s=0.01, batch_size=3, scheduled_tokens=9, draft_tokens=4, prefill_tokens=2,
                   draft_depth=2, agg=agg)


def test_a_post_gives_the_gil_up_between_its_phases_and_while_it_builds_a_large_batch(monkeypatch) -> None:
    """The engine loop shares the GIL with the reporter: a post pauses (sleep 0) after building its batch, after
    the answer arrives and before installing the policy, and every YIELD_EVERY_ROWS rows of a batch, so a
    waiting engine loop never waits for a whole post."""
    from specctl_vllm.engine_patch import reporter as reporter_module

    log: list[str] = []
    reporter, fake, queue, holder, _ = make([ok()], pause=lambda s: log.append(f"pause {s}"))
    real_post, real_install, real_wire = reporter._client.post, holder.install, reporter_module.row_to_wire
    monkeypatch.setattr(reporter._client, "post", lambda *a, **k: (log.append("post"), real_post(*a, **k))[1])
    monkeypatch.setattr(holder, "install", lambda *a, **k: (log.append("install"), real_install(*a, **k))[1])
    monkeypatch.setattr(reporter_module, "row_to_wire", lambda r: (log.append("row"), real_wire(r))[1])
    rows = 2 * reporter_module.YIELD_EVERY_ROWS + 1
    for i in range(rows):
        queue.push(row(float(i)))
    assert reporter.run_once() == "accepted"
    chunk = ["row"] * reporter_module.YIELD_EVERY_ROWS + ["pause 0"]
    assert log == 2 * chunk + ["row", "pause 0", "post", "pause 0", "pause 0", "install"]
    assert len(fake.bodies[0]["steps"]) == rows and holder.current(50.0).version == 3


def test_delivers_a_valid_batch_and_installs_the_policy() -> None:
    reporter, fake, queue, holder, clock = make([ok()])
    queue.push(row())
    assert reporter.run_once() == "accepted"
    batch = protocol.TelemetryBatch.model_validate(fake.bodies[0])
    assert (batch.seq, batch.engine_id, len(batch.steps), batch.policy_version) == (0, "host-dp0", 1, None)
    assert batch.steps[0].categories[0].counterfactual["suffix"][0].k == 3
    assert batch.steps[0].categories[0].counterfactual_attempts == {"suffix": 4}
    assert "counterfactual_attempts" not in fake.bodies[0]["steps"][0]["categories"][1]
    assert fake.headers[0]["authorization"] == f"Bearer {TOKEN}"
    assert holder.current(clock()).version == 3
    queue.push(row())
    reporter.run_once()
    assert fake.bodies[1]["seq"] == 1 and fake.bodies[1]["policy_version"] == 3


@pytest.mark.parametrize(
    "failure",
    [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), status(503), status(401), status(429),
     lambda b: httpx.Response(200, content=b"<html>"),  # garbage
     lambda b: httpx.Response(200, json={**ack(b["seq"]), "seq": b["seq"] + 5}),  # ack for another batch
     lambda b: httpx.Response(200, json={**ack(b["seq"]), "policy": {"version": -1}})],  # invalid policy
)
def test_failures_retry_the_same_batch(failure) -> None:
    reporter, fake, queue, holder, clock = make([failure, ok()])
    queue.push(row())
    assert reporter.run_once() == "retry"
    queue.push(row(2.0))  # arrives meanwhile: goes into the next batch, not into the retried one
    assert holder.current(clock()).is_static
    assert reporter.run_once() == "accepted"
    assert fake.bodies[0] == fake.bodies[1]  # byte-identical retry: the controller can de-duplicate it
    reporter.run_once()
    assert fake.bodies[2]["seq"] == 1 and len(fake.bodies[2]["steps"]) == 1


def test_a_refused_batch_is_dropped_not_retried_forever() -> None:
    reporter, fake, queue, _, _ = make([status(422)])
    queue.push(row())
    assert reporter.run_once() == "rejected"
    assert reporter.run_once() == "accepted"
    assert [b["seq"] for b in fake.bodies] == [0, 1] and fake.bodies[1]["steps"] == []
    assert reporter.counters.rejected_batches == 1


def test_duplicate_acks_count_as_delivered() -> None:
    reporter, _, _, _, _ = make([ok(outcome="duplicate")])
    assert reporter.run_once() == "duplicate"
    assert reporter.counters.duplicates == 1


def test_backoff_doubles_and_is_capped_then_resets() -> None:
    reporter, _, _, _, _ = make([httpx.ConnectError("x")] * 8, backoff_max_s=1.0)
    delays = []
    for _ in range(6):
        reporter.run_once()
        delays.append(reporter.next_delay())
    assert delays == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    reporter._client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(
        200, json=ack(json.loads(r.content)["seq"]))))
    reporter.run_once()
    assert reporter.next_delay() == pytest.approx(0.1)


def test_policy_expires_when_the_controller_goes_silent() -> None:
    reporter, _, _, holder, clock = make([ok(ttl=1.0), httpx.ConnectError("down")])
    reporter.run_once()
    clock.t += 0.5
    assert reporter.run_once() == "retry"
    assert holder.current(clock()).version == 3  # still within ttl
    clock.t += 0.6
    assert holder.current(clock()).is_static


def test_dropped_steps_are_reported() -> None:
    reporter, fake, queue, _, _ = make([ok()], queue_steps=16)
    for i in range(20):
        queue.push(row(float(i)))
    reporter.run_once()
    assert fake.bodies[0]["dropped_steps"] == 4
    assert [s["t"] for s in fake.bodies[0]["steps"]][:2] == [4.0, 5.0]  # the oldest went first


def test_batches_are_capped_in_steps() -> None:
    reporter, fake, queue, _, _ = make([ok(), ok()], batch_max_steps=3)
    for i in range(5):
        queue.push(row(float(i)))
    reporter.run_once()
    reporter.run_once()
    assert [len(b["steps"]) for b in fake.bodies] == [3, 2]


def test_thread_posts_on_its_own_and_stops_with_a_flush() -> None:
    reporter, fake, queue, _, _ = make([], report_interval_s=0.01)
    reporter.start()
    deadline = time.monotonic() + 5
    while not fake.bodies and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.push(row())
    reporter.stop(flush=True)
    assert fake.bodies and sum(len(b["steps"]) for b in fake.bodies) == 1
    assert [b["seq"] for b in fake.bodies] == list(range(len(fake.bodies)))


@pytest.mark.parametrize(("full_graphs", "sent"), [(False, None), (True, True)])
def test_the_spec_leaves_out_defaults_so_older_controllers_accept_it(full_graphs, sent) -> None:
    engine = EngineSpec("ngram", 4, ("suffix",), full_cuda_graphs=full_graphs)
    _reporter, fake, queue, _holder, _clock = make([ok()], engine)
    queue.push(row())
    _reporter.run_once()
    assert fake.bodies[0]["spec"].get("full_cuda_graphs") is sent
    assert protocol.TelemetryBatch.model_validate(fake.bodies[0]).spec.full_cuda_graphs is full_graphs


def test_a_batch_refused_with_429_is_trimmed_then_dropped_and_retry_after_is_honoured() -> None:
    busy = lambda b: httpx.Response(429, json={"detail": "busy"}, headers={"Retry-After": "3"})
    reporter, fake, queue, _, _ = make([busy] * 4, backoff_max_s=30.0)
    for t in range(8):
        queue.push(row(float(t)))
    assert reporter.run_once() == "retry"
    assert reporter.next_delay() == pytest.approx(3.0)  # Retry-After, above the 0.2 s backoff
    assert reporter.run_once() == "retry"  # second refusal: cut to the newest half
    assert reporter.run_once() == "retry"
    assert reporter.run_once() == "dropped"  # fourth: dropped, counted, the stream goes on
    assert [len(b["steps"]) for b in fake.bodies] == [8, 8, 4, 2]
    assert fake.bodies[2]["dropped_steps"] == 4 and {b["seq"] for b in fake.bodies} == {0}
    assert reporter.counters.dropped_batches == 1 and reporter.counters.trimmed_steps == 4 + 2 + 2
    assert reporter.run_once() == "accepted"
    assert fake.bodies[-1]["seq"] == 1
