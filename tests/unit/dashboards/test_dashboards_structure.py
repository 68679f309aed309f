"""Structure every dashboard must have to sit next to vLLM's and to be readable."""

import re

import pytest

from dashboards.generate import DASHBOARDS
from dashboards.panels import GRID_WIDTH
from dashboards.queries import queried_metrics

NAMES = list(DASHBOARDS)


def panels(board):
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_uids_and_titles_unique(boards):
    assert len({b["uid"] for b in boards.values()}) == len(boards)
    assert len({b["title"] for b in boards.values()}) == len(boards)


@pytest.mark.parametrize("name", NAMES)
def test_tags_and_variables(boards, name):
    board = boards[name]
    assert "vllm" in board["tags"] and "specctl" in board["tags"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for var in ("model_name", "engine", "category"):
        assert variables[var]["type"] == "query" and variables[var]["includeAll"] and variables[var]["multi"]


@pytest.mark.parametrize("name", NAMES)
def test_panels_use_the_datasource_variable(boards, name):
    for panel in panels(boards[name]):
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], panel["title"]


@pytest.mark.parametrize("name", NAMES)
def test_grid_has_no_overlap(boards, name):
    ids, cells = set(), set()
    for panel in panels(boards[name]):
        assert panel["id"] not in ids
        ids.add(panel["id"])
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= GRID_WIDTH, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine


@pytest.mark.parametrize("name", NAMES)
def test_descriptions_name_the_metrics_queried(boards, name):
    """Each panel's description names (in backticks) every metric its queries read."""
    for panel in panels(boards[name]):
        if panel["type"] == "row":
            continue
        named = set(re.findall(r"`([^`]+)`", panel["description"]))
        for metric in queried_metrics([t["expr"] for t in panel["targets"]]):
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            assert metric in named or base in named, f"{name} / {panel['title']}: {metric} not in description"


def test_readme_explains_every_panel(boards):
    from dashboards.generate import REPO_ROOT

    readme = (REPO_ROOT / "dashboards" / "README.md").read_text(encoding="utf-8")
    missing = [
        f"{name} / {panel['title']}"
        for name, board in boards.items()
        for panel in panels(board)
        if panel["type"] != "row" and f"**{panel['title']}**" not in readme
    ]
    assert missing == []
    for board in boards.values():
        assert board["title"] in readme
