"""Every panel query: known metrics only, Grafana interval variables, guarded denominators."""

import re

import pytest

from dashboards import metrics as m
from dashboards.generate import all_panel_queries
from dashboards.queries import (
    parse_label_values,
    queried_metrics,
    substitute,
    unknown_metrics,
    variable_queries,
)

QUERIES = all_panel_queries()


def test_there_are_queries():
    assert len(QUERIES) >= 40
    assert len({q.key for q in QUERIES}) == len(QUERIES)


def test_only_known_metrics():
    assert unknown_metrics([q.expr for q in QUERIES]) == []


def test_every_fixed_metric_is_on_a_dashboard():
    seen = {re.sub(r"_(bucket|sum|count)$", "", name) for name in queried_metrics([q.expr for q in QUERIES])}
    assert (m.FIXED | m.VLLM) - seen == set()


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.key)
def test_windows_are_grafana_intervals(query):
    """Rates follow the scrape interval ($__rate_interval) or the picked range ($__range), never a
    hard-coded window that would be wrong for someone else's scrape interval."""
    for window in re.findall(r"\[([^\]]*)\]", query.expr):
        assert window in ("$__rate_interval", "$__range", "$__range:"), window


def _group(text: str, start: int) -> str:
    """The balanced parenthesised group opening at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start : i + 1]
    raise AssertionError(f"unbalanced: {text[start:]}")


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.key)
def test_denominators_are_guarded(query):
    for match in re.finditer(r"/\s*(?:on \([^)]*\) group_left \(\)\s*)?(?=\()", query.expr):
        denominator = _group(query.expr, match.end())
        assert denominator.endswith("> 0)"), denominator
    assert query.expr.count("/") == len(re.findall(r"/\s*(?:on \([^)]*\) group_left \(\)\s*)?\(", query.expr))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("label_values(specctl_request_steps_total, model_name)", ("specctl_request_steps_total", "model_name")),
        ('label_values(m{a=~"$b"}, category)', ('m{a=~"$b"}', "category")),
        ("label_values(engine)", (None, "engine")),
    ],
)
def test_parse_label_values(query, expected):
    assert parse_label_values(query) == expected


def test_parse_label_values_rejects_other_queries():
    with pytest.raises(ValueError):
        parse_label_values("query_result(up)")


def test_variables_read_known_metrics(boards):
    found = variable_queries(boards)
    assert {name for _, name, _ in found} == {"model_name", "engine", "category"}
    for _, name, query in found:
        series, label = parse_label_values(query)
        assert label == name
        assert unknown_metrics([series]) == [] and queried_metrics([series])


@pytest.mark.parametrize(
    ("expr", "variables", "expected"),
    [
        ('rate(x{a=~"$a"}[$__rate_interval])', {"a": ".+", "__rate_interval": "4s"}, 'rate(x{a=~".+"}[4s])'),
        ("uid ${datasource}", {"datasource": "p"}, "uid p"),
        # Longer names first: $__range must not eat the prefix of $__range_s, $model of $model_name.
        ('{m=~"$model_name"}', {"model": "WRONG", "model_name": "a"}, '{m=~"a"}'),
    ],
)
def test_substitute(expr, variables, expected):
    assert substitute(expr, variables) == expected


def test_substitute_refuses_leftovers():
    with pytest.raises(ValueError, match=r"\$category"):
        substitute('x{c=~"$category"}', {"model_name": ".+"})


@pytest.mark.parametrize(
    ("exprs", "unknown"),
    [
        (["specctl_accepted_tokens_per_draft_bucket", "specctl_accepted_tokens_per_draft_count"], []),
        (["specctl_drafts_total_bucket"], ["specctl_drafts_total_bucket"]),
        (["specctl_nonexistent"], ["specctl_nonexistent"]),
        (["vllm:spec_decode_num_drafts_total", "vllm:num_requests_running"], ["vllm:num_requests_running"]),
    ],
)
def test_unknown_metrics(exprs, unknown):
    assert unknown_metrics(exprs) == unknown
