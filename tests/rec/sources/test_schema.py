"""The record schema (``lit_amp.rec.sources.schema``): JSON lines round-trip, and one
malformed-record path: every hostile line is a ``ValueError`` of ``ClickSchema.parse_json``, and
a run over a topic with a tombstone trains past it.

The contract (``test_contract.py``) feeds the same hostile table, and hypothesis-drawn lines,
through every source; here the schema's side of it, and what a user of ``online_train`` sees.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# ---------------------------------------------------------------------- shard arrays
_BAD_LABELS = [0.5, np.nan, 2.0]
_BAD_DENSE = [np.inf, -np.inf, np.nan, 1e39]  # 1e39: inf in float32


@st.composite
def _shards(draw):
    """Clean shards, and shards with a few hostile values in random places."""
    n = draw(st.integers(1, 6))
    int_dtype = draw(st.sampled_from([np.int64, np.int32, np.uint64]))
    big = [2**64 - 1, 2**63] if int_dtype == np.uint64 else [-1, -(2**31)]
    label = np.array(draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n)), float)
    dense = np.array(draw(st.lists(st.floats(-3, 3), min_size=n * 13, max_size=n * 13)))
    cat = np.array(draw(st.lists(st.integers(0, 2**31 - 1), min_size=n * 26,
                                 max_size=n * 26)), dtype=object)
    ids = np.array(draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n)), dtype=object)
    for _ in range(draw(st.integers(0, 3))):  # hostile values
        which = draw(st.sampled_from(["label", "dense", "cat", "id"]))
        col, bad = {"label": (label, _BAD_LABELS), "dense": (dense, _BAD_DENSE),
                    "cat": (cat, big), "id": (ids, big[:1])}[which]
        col[draw(st.integers(0, col.size - 1))] = draw(st.sampled_from(bad))
    label_dtype = draw(st.sampled_from([np.float32, np.float64]))
    with np.errstate(over="ignore", invalid="ignore"):
        return {
            "id": ids.astype(np.uint64 if int_dtype == np.uint64 else np.int64),
            "label": label.astype(label_dtype),
            "dense": dense.astype(draw(st.sampled_from([np.float32, np.float64]))).reshape(
                n, 13),
            "cat": cat.astype(int_dtype).reshape(n, 26),
        }


@settings(max_examples=150, deadline=None)
@given(cols=_shards())
def test_check_columns_shortcut_for_clean_shards_agrees_with_the_row_by_row_check(cols):
    """Clean shards skip the per-row masks (whole-array reductions decide); whatever a shard
    holds, the result equals the row-by-row check's: rows kept, dtypes, dead letters."""
    schema = ClickSchema()
    got = schema.check_columns(cols)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ClickSchema, "_clean", lambda *a: False)
        want = schema.check_columns(cols)
    (g_cols, g_index, g_bad, g_n), (w_cols, w_index, w_bad, w_n) = got, want
    assert g_n == w_n and g_index.tolist() == w_index.tolist()
    assert [(i, why) for i, why, _ in g_bad] == [(i, why) for i, why, _ in w_bad]
    for k in w_cols:
        assert g_cols[k].dtype == w_cols[k].dtype and g_cols[k].shape == w_cols[k].shape
        np.testing.assert_array_equal(g_cols[k], w_cols[k])


def test_a_clean_shard_takes_the_shortcut_and_a_bad_row_does_not():
    schema = ClickSchema()
    cols = SyntheticClickSource(batch_size=8, seed=3).columns(0)
    assert schema._clean(cols, cols["label"].astype(np.float64), cols["dense"])
    cols["cat"][5, 2] = -4
    assert not schema._clean(cols, cols["label"].astype(np.float64), cols["dense"])
    valid, index, bad, n = schema.check_columns(cols)
    assert n == 8 and 5 not in index.tolist() and bad[0][:2] == (5, "'cat' holds a negative id")
