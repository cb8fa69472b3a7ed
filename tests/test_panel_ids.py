"""Panel ids are assigned, not typed: a row's id is its number, the n-th panel under it gets
the row's id + n (render/dashboards/layout.py), and no id is given twice."""

from __future__ import annotations

import json

import pytest

from rlhf_exporter.render.dashboards import targets
from rlhf_exporter.render.dashboards.layout import Board, Cell, Row
from rlhf_exporter.render.dashboards.panels import Q, time_series
from rlhf_exporter.thresholds_file import load_thresholds


@pytest.mark.parametrize("path", sorted(targets(load_thresholds())))
def test_each_panel_id_is_its_rows_id_plus_its_position(path):
    doc = json.loads(targets(load_thresholds())[path])
    row_id, n, seen = None, 0, 0
    for p in doc["panels"]:
        if p["type"] == "row":
            row_id, n = p["id"], 0
            assert row_id % 50 == 0, (path, p["title"], row_id)
            continue
        n += 1
        seen += 1
        assert row_id is not None and p["id"] == row_id + n, (path, p["title"], p["id"])
    assert seen > 10


def _panel(title: str):
    return time_series(title, "a test panel", [Q("up", "{{job}}")], "short")


def test_a_row_whose_panels_reach_the_next_rows_number_is_refused():
    board = Board("uid", "t", "d", ())
    board.add_row(Row(100, "first", [Cell(_panel("a"), 24, 4), Cell(_panel("b"), 24, 4)]))
    with pytest.raises(ValueError, match="used twice"):
        board.add_row(Row(101, "second", [Cell(_panel("c"), 24, 4)]))
