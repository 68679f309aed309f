"""The piecewise JSON decode means what json.loads means, and refuses what it refuses."""

from __future__ import annotations

import json

import pytest

from specctl_vllm.controller.service.json_pieces import decode_object

SAME = [
    '{"steps": [{"a": 1}, {"b": [1, 2.5, null]}, 3], "seq": 4}',
    '  {\r\n "seq" :1 ,\t"steps":[ ] }  \n',
    "{}",
    '{"steps": {"a": 1}}',  # not an array: decoded whole, the caller refuses it
    '{"steps": [1], "steps": [2, 3]}',  # duplicate keys: the last wins, as in json.loads
    '{"x": "\\u00e9\\n", "steps": [[], {}, "s"]}',
    '{"nested": {"steps": [1, 2]}, "steps": [true, false]}',
]
REFUSED = [
    '{"steps": [1, 2,]}',  # trailing comma
    '{"steps": [1 2]}',
    '{"steps": [NaN]}',  # a constant JSON does not have
    '{"a": Infinity}',
    '{"a": 1} x',  # extra data
    '{"a": 1',
    '{1: 2}',
    "",
    '{"a" 1}',
    '{"steps": [1], }',
]


@pytest.mark.parametrize("text", SAME)
def test_decodes_what_json_loads_decodes(text):
    pieces = []
    pauses = []
    doc = decode_object(text, "steps", lambda v: pieces.append(v) or ("seen", v), pauses.append, 2)
    expected = json.loads(text)
    if isinstance(expected.get("steps"), list):
        assert doc["steps"] == [("seen", v) for v in expected["steps"]]
        assert pieces[len(pieces) - len(expected["steps"]):] == expected["steps"]  # a duplicate's came first
        assert len(pauses) == sum(n // 2 for n in (len(pieces) - len(expected["steps"]), len(expected["steps"])))
        doc = {**doc, "steps": expected["steps"]}
    assert doc == expected


@pytest.mark.parametrize("text", REFUSED)
def test_refuses_what_json_loads_refuses(text):
    with pytest.raises(ValueError):
        json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    with pytest.raises(ValueError):
        decode_object(text, "steps", lambda v: v, lambda _: None, 2)


@pytest.mark.parametrize("text", ["[1, 2]", '"steps"', "3"])
def test_a_document_that_is_no_object_is_refused(text):
    with pytest.raises(ValueError):
        decode_object(text, "steps", lambda v: v, lambda _: None, 2)
