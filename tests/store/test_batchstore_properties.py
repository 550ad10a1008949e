"""Property-based check of the store against a naive reference model of the pull protocol.

The model keeps every batch ever appended with its fate (held, released, dropped) and applies
the rules of docs/protocol.md literally, in O(n) per step; every PullResult field and every
accounting counter of the real store must match it after any sequence of operations, including
read-ahead pulls (``read_after_sequence``: after the previous answer, behind the cursor, beyond
the newest batch) mixed with acknowledgements and re-reads from the cursor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpumetrics.store import LOGS, METRICS, BatchStore, Signal, StoreLimits, TooManyConsumersError
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from .conftest import Clock, build_request, tags

LIMITS = StoreLimits(
    max_bytes=900, max_data_points=40, max_age_s=50, consumer_ttl_s=30, max_consumers=2
)
NAMES = ("a", "b", "c")


@dataclass
class MBatch:
    seq: int
    points: int
    size: int
    t: float
    state: str = "held"


@dataclass
class MConsumer:
    acked: int
    delivered: int
    last_seen: float
    dropped_total: int = 0
    pending: int = 0
    last_answer: int = 0  # last_sequence of its latest non-empty answer (its read-ahead)
    reasons: list[str] = field(default_factory=list)


class StoreModel(RuleBasedStateMachine):
    SIGNAL: Signal = METRICS
    """What the store holds (a subclass per signal)."""

    @initialize()
    def setup(self) -> None:
        self.clock = Clock()
        self.store = BatchStore(LIMITS, clock=self.clock, epoch="E", signal=self.SIGNAL)
        self.batches: list[MBatch] = []
        self.consumers: dict[str, MConsumer] = {}
        self.acked_hw = 0

    # -- the reference model ------------------------------------------------------------------
    def held(self) -> list[MBatch]:
        return [b for b in self.batches if b.state == "held"]

    def m_release(self) -> None:
        floor = min(c.acked for c in self.consumers.values()) if self.consumers else self.acked_hw
        for b in self.held():
            if b.seq <= floor:
                b.state = "released"

    def m_expire(self, now: float, keep: str | None = None) -> None:
        for name in [
            n
            for n, c in self.consumers.items()
            if now - c.last_seen > LIMITS.consumer_ttl_s and n != keep
        ]:
            del self.consumers[name]
            self.m_release()
        for reason, over in (
            ("max_age", lambda: bool(self.held()) and now - self.held()[0].t > LIMITS.max_age_s),
            (
                "max_data_points",
                lambda: sum(b.points for b in self.held()) > LIMITS.max_data_points,
            ),
            ("max_bytes", lambda: sum(b.size for b in self.held()) > LIMITS.max_bytes),
        ):
            while self.held() and over():
                b = self.held()[0]
                b.state = "dropped"
                for c in self.consumers.values():
                    if c.acked < b.seq:
                        c.dropped_total += b.points
                        c.pending += b.points
                        if reason not in c.reasons:
                            c.reasons.append(reason)
                        c.acked = b.seq
                        c.delivered = max(c.delivered, b.seq)

    # -- rules ----------------------------------------------------------------------------------
    @rule(points=st.integers(0, 25))
    def append(self, points: int) -> None:
        seq = len(self.batches) + 1
        req = build_request(points, f"s{seq}", self.SIGNAL)
        assert self.store.append(req) == seq
        self.batches.append(MBatch(seq, points, req.ByteSize(), self.clock.now))
        self.m_expire(self.clock.now)

    @rule(seconds=st.sampled_from([1.0, 10.0, 29.0, 31.0, 60.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def expire(self) -> None:
        self.store.expire()
        self.m_expire(self.clock.now)

    @rule(
        name=st.sampled_from(NAMES),
        ack=st.sampled_from(["none", "delivered", "beyond", "wrong_epoch"]),
        max_points=st.sampled_from([0, 1, 10]),
        max_bytes=st.sampled_from([0, 50, 400]),
        ack_only=st.booleans(),
        read=st.sampled_from(["cursor", "ahead", "behind", "beyond"]),
    )
    def pull(
        self, name: str, ack: str, max_points: int, max_bytes: int, ack_only: bool, read: str
    ) -> None:
        now = self.clock.now
        c = self.consumers.get(name)
        # read-ahead: continue after the previous answer without acknowledging it
        read_after = {
            "cursor": 0,
            "ahead": c.last_answer if c else 0,
            "behind": max(c.acked - 1, 0) if c else 0,
            "beyond": len(self.batches) + 3,
        }[read]
        ack_seq = {
            "none": 0,
            "delivered": c.delivered if c else 0,
            "beyond": len(self.batches) + 5,
            "wrong_epoch": c.delivered if c else 3,
        }[ack]
        epoch = "other" if ack == "wrong_epoch" else "E"
        if c is not None:
            c.last_seen = now
        self.m_expire(now, keep=name)
        c = self.consumers.get(name)
        if c is None and len(self.consumers) >= LIMITS.max_consumers:
            try:
                self.store.pull(name, ack_seq, epoch, max_points, max_bytes, ack_only, read_after)
            except TooManyConsumersError:
                # refused: not registered; the housekeeping it did (expiry, age drops) is what
                # the model applied above, and the invariants compare the rest
                assert name not in {cs.name for cs in self.store.stats().consumers}
                return
            raise AssertionError("expected TooManyConsumersError")
        if c is None:
            held = self.held()
            base = held[0].seq - 1 if held else len(self.batches)
            c = self.consumers[name] = MConsumer(acked=base, delivered=base, last_seen=now)
        if epoch == "E" and ack_seq > c.acked:
            c.acked = min(ack_seq, c.delivered)
            self.acked_hw = max(self.acked_hw, c.acked)
            self.m_release()
        position = max(read_after, c.acked) if epoch == "E" else c.acked
        expect_dropped, expect_reasons = c.pending, tuple(c.reasons)
        c.pending, c.reasons = 0, []
        chosen: list[MBatch] = []
        if not ack_only:
            for b in (b for b in self.held() if b.seq > position):
                pts = sum(x.points for x in chosen)
                size = sum(x.size for x in chosen)
                if chosen and (
                    (max_points and pts + b.points > max_points)
                    or (max_bytes and size + b.size > max_bytes)
                ):
                    break
                chosen.append(b)
            if chosen:
                c.delivered = max(c.delivered, chosen[-1].seq)
                c.last_answer = chosen[-1].seq
        tail = chosen[-1].seq if chosen else position
        r = self.store.pull(name, ack_seq, epoch, max_points, max_bytes, ack_only, read_after)
        assert r.epoch == "E"
        assert (r.first_sequence, r.last_sequence) == (
            (chosen[0].seq, chosen[-1].seq) if chosen else (0, 0)
        )
        assert r.more == any(b.seq > tail for b in self.held())
        assert (r.dropped_data_points, r.drop_reasons) == (expect_dropped, expect_reasons)
        assert r.dropped_data_points_total == c.dropped_total
        assert r.data_points == sum(b.points for b in chosen)
        req = self.SIGNAL.parse(r.data)
        assert self.SIGNAL.count(req) == r.data_points
        assert tags(self.SIGNAL, req) == [f"s{b.seq}" for b in chosen]

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def accounting_is_exact(self) -> None:
        s = self.store.stats()
        by_state = {
            k: sum(b.points for b in self.batches if b.state == k)
            for k in ("held", "released", "dropped")
        }
        assert s.appended_points == sum(b.points for b in self.batches)
        assert (s.held_points, s.released_points, sum(s.dropped_points.values())) == (
            by_state["held"],
            by_state["released"],
            by_state["dropped"],
        )
        assert (
            s.appended_points == s.released_points + sum(s.dropped_points.values()) + s.held_points
        )
        assert s.held_points <= LIMITS.max_data_points and s.held_bytes <= LIMITS.max_bytes
        assert {c.name for c in s.consumers} == set(self.consumers)
        for cs in s.consumers:
            assert (
                cs.offered_points
                == cs.acked_points + cs.dropped_points_total + cs.unacked_held_points
            )
            assert cs.acked_sequence == self.consumers[cs.name].acked


class LogStoreModel(StoreModel):
    SIGNAL = LOGS


_SETTINGS = settings(
    derandomize=True,  # deterministic in CI; explore locally with derandomize off, more examples
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
StoreModel.TestCase.settings = _SETTINGS
LogStoreModel.TestCase.settings = _SETTINGS
TestStoreModel = StoreModel.TestCase
TestLogStoreModel = LogStoreModel.TestCase
