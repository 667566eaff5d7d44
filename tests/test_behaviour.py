"""Behaviour is unchanged by refactors: the smoke bench configs' records and a few library calls
(tokens, target calls, ranks, draft forwards, labels) equal the fixture written by the code
before the request redesign (``tests/behaviour.py``)."""

from __future__ import annotations

import json

import pytest

from tests.behaviour import FIXTURE, records


@pytest.fixture(scope="module")
def now() -> dict[str, list[dict[str, object]]]:
    return records()


@pytest.mark.parametrize("part", ["smoke-toy", "smoke-batch", "library"])
def test_records_equal_the_fixture(now: dict[str, list[dict[str, object]]], part: str) -> None:
    pinned = json.loads(FIXTURE.read_text())[part]
    got = json.loads(json.dumps(now[part]))  # the fixture's JSON types (tuples as lists)
    assert len(got) == len(pinned)
    for a, b in zip(got, pinned, strict=True):
        assert a == b
