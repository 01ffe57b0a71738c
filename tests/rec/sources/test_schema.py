"""The record schema (``lit_amp.rec.sources.schema``): JSON lines round-trip, and one
malformed-record path: every hostile line is a ``ValueError`` of ``ClickSchema.parse_json``, and
a run over a topic with a tombstone trains past it.

The contract (``test_contract.py``) feeds the same hostile table, and hypothesis-drawn lines,
through every source; here the schema's side of it, and what a user of ``online_train`` sees.
"""

from __future__ import annotations

import numpy as np
import pytest

from lit_amp.rec import StopOptions
from lit_amp.rec.sources import KafkaSource, SyntheticClickSource
from lit_amp.rec.sources.schema import ClickSchema
from tests.rec._helpers import make_model
from tests.rec.sources.contract import HOSTILE, HOSTILE_NAMES, FakeConsumer, valid


@pytest.mark.parametrize(("name", "raw", "word"), HOSTILE, ids=HOSTILE_NAMES)
def test_parse_json_turns_every_hostile_line_into_a_value_error(name, raw, word):
    schema = ClickSchema()
    forms = [raw] if raw is None else [raw, raw.decode("latin-1")]  # bytes and text
    for value in forms:
        with pytest.raises(ValueError) as info:
            schema.parse_json(value)
        assert str(info.value)  # a reason for the dead-letter entry
        if word is not None:
            assert word in str(info.value)


def test_online_train_over_a_topic_with_a_tombstone_trains_past_it(tmp_path):
    """What a user sees: the run neither crashes nor stops at the tombstone, and says why it
    ended (``idle_timeout``, not ``source_exhausted``)."""
    values = [valid(i) for i in range(12)]
    values[4] = None  # a compacted topic's deleted key
    src = KafkaSource(
        "clicks",
        batch_size=4,
        consumer_factory=lambda: FakeConsumer({0: values}),
        max_idle_s=0.2,
        poll_timeout_s=0.01,
    )
    summary = make_model().online_train(
        src, dataset_sink_mode=False, stop=StopOptions(max_steps=50)
    )
    assert summary.records == 11
    assert src.malformed == 1
    assert summary.stop_reason == "idle_timeout"


def test_click_schema_json_round_trip():
    cols = SyntheticClickSource(batch_size=5, seed=2).columns(0)
    schema = ClickSchema()
    lines = schema.to_json_lines(cols).splitlines()
    back, index, bad = schema.parse_json_lines(lines)
    assert bad == [] and index.tolist() == list(range(5))
    for k in cols:
        np.testing.assert_array_equal(back[k], cols[k])
