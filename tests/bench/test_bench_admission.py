"""Benchmark (not CI): what the scheduler's admission adds to every host request, beside the floor of
parsing the subject it needs anyway.

    uv run pytest tests/bench/test_bench_admission.py -m bench -s

Admission runs in the NATS callback of the endpoint, before the request gets a task: the reply-subject
check and the fair share for an admitted request, plus the (cached) 429 for a refused one. Compare with a
renewal's own cost from tests/bench/test_bench_nats.py (about a millisecond of scheduler CPU each).
"""

from __future__ import annotations

import time

import pytest

from devsched.core.fairshare import ShareLimits
from devsched.protocol.subjects import Subjects
from devsched.scheduler.admission import Admission
from devsched.scheduler.service import _too_many_requests

pytestmark = pytest.mark.bench

ROUNDS = 200_000


def _per_call_us(fn: object, rounds: int = ROUNDS) -> float:
    assert callable(fn)
    best = float("inf")
    for _ in range(5):  # the best of five: the least disturbed by the rest of the machine
        started = time.perf_counter()
        for _ in range(rounds):
            fn()
        best = min(best, (time.perf_counter() - started) / rounds)
    return best * 1e6


def test_admission_cost_per_request() -> None:
    subjects = Subjects("devsched")
    subject, reply = "devsched.host.bench-07.renew", "_INBOX.bench-07.AbCdEfGhIjKlMnOpQrStUv.42"
    wide = ShareLimits(max_in_flight=1_000_000, rate_per_s=1e12, burst=1_000_000_000)
    admitting = Admission(host_inbox_prefixes=("_INBOX.{host_id}.",), operator_inbox_prefixes=("_INBOX.",), limits=wide)
    refusing = Admission(
        host_inbox_prefixes=("_INBOX.{host_id}.",),
        operator_inbox_prefixes=("_INBOX.",),
        limits=ShareLimits(max_in_flight=1, rate_per_s=1.0, burst=1),
    )
    refusing.take("bench-07", subject)  # its one slot stays taken

    def floor() -> None:
        subjects.host_id_of(subject)

    def admitted() -> None:
        host_id = subjects.host_id_of(subject)
        admitting.host_reply_allowed(host_id, subject, reply)
        admitting.take(host_id, subject)
        admitting.give_back(host_id)

    def refused() -> None:
        host_id = subjects.host_id_of(subject)
        refusing.host_reply_allowed(host_id, subject, reply)
        retry_after_s = refusing.take(host_id, subject)
        assert retry_after_s is not None
        _too_many_requests(max(1, round(retry_after_s * 1000)))

    floor_us, admitted_us, refused_us = _per_call_us(floor), _per_call_us(admitted), _per_call_us(refused)
    print(f"\nsubject parse (floor) {floor_us:.2f} us")
    print(f"admitted request      {admitted_us:.2f} us  (x{admitted_us / floor_us:.1f} the floor)")
    print(f"refused request (429) {refused_us:.2f} us  (x{refused_us / floor_us:.1f} the floor)")
    assert admitted_us > 0
