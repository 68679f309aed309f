"""A mixed chat workload (prose, JSON with and without response_format, code, code edits, tool calls,
summarisation, multi-turn) and a small driver for vLLM's OpenAI endpoint.

Used by the e2e tests, the demo and the benchmarks, so that every figure comes from the same prompts.
:func:`build_workload` is deterministic: the same arguments give the same prompts in the same order.

Categories: ``structured`` and ``tool_call`` requests carry no explicit category (they exercise the
derivation from ``response_format`` / ``tools``); every other prompt names its category in
``vllm_xargs.specctl_category``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

CATEGORIES = ("prose", "json", "structured", "code", "code_edit", "tool_call", "summarise", "multi_turn")

_SUBJECTS = ["a lighthouse keeper", "a robot gardener", "a lost cat", "a young astronomer", "an old bridge",
             "a city at night", "a mountain village", "a jazz musician", "a library that never closes",
             "a ship in a storm", "a desert fox", "a clockmaker"]
_PEOPLE = [("Alice", 30, "Paris"), ("Bob", 42, "Berlin"), ("Chen", 27, "Shanghai"), ("Dana", 35, "Denver"),
           ("Emeka", 51, "Lagos"), ("Fatima", 23, "Casablanca"), ("Goran", 64, "Zagreb"), ("Hana", 31, "Kyoto")]
_TASKS = ["reverses a list", "checks whether a string is a palindrome", "computes the factorial of n",
          "merges two sorted lists", "counts the words in a sentence", "returns the n-th Fibonacci number",
          "removes duplicates from a list while keeping order", "converts Celsius to Fahrenheit"]
_SNIPPETS = [
    ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
     "Add type hints and a docstring to every function. Return the whole file."),
    (("class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n"
      "        self.count += 1\n        return self.count\n"),
     "Add a reset method and a decrement method. Return the whole class."),
    ("for i in range(10):\n    if i % 2 == 0:\n        print(i, 'even')\n    else:\n        print(i, 'odd')\n",
     "Rewrite this loop as a function that takes n as a parameter. Keep the same output."),
    ("def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n",
     "Rename the parameters to width and height everywhere. Return the whole file."),
]
_PASSAGES = [
    ("The city council met on Tuesday to discuss the new bicycle lanes. The council agreed to build twelve "
     "kilometres of protected lanes by next summer. Shop owners worried about parking, but the council said "
     "that studies show cyclists spend more in local shops. The first lanes will open on Main Street in May."),
    ("Photosynthesis is the process plants use to turn light into chemical energy. Leaves absorb sunlight with "
     "chlorophyll, take in carbon dioxide from the air and water from the roots, and produce glucose and "
     "oxygen. The glucose feeds the plant, and the oxygen is released into the air."),
    ("The museum will close for renovation from March to September. During this time, the main collection "
     "will travel to three partner museums. The renovation adds a new wing for modern art, a larger cafe, and "
     "better access for visitors in wheelchairs. Tickets bought for the closed months will be refunded."),
]
_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["C", "F"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Find flights between two cities on a date",
        "parameters": {"type": "object", "properties": {"origin": {"type": "string"},
                                                        "destination": {"type": "string"},
                                                        "date": {"type": "string"}},
                       "required": ["origin", "destination", "date"]}}},
]
_PERSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                     "city": {"type": "string"}},
    "required": ["name", "age", "city"], "additionalProperties": False}}}


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: list[dict[str, Any]]
    max_tokens: int = 64
    explicit_category: bool = True  # False: the category must be derived (response_format / tools)
    extra: dict[str, Any] = field(default_factory=dict)  # response_format, tools, tool_choice

    def body(self, model: str, *, temperature: float = 0.0, logprobs: int | None = None,
             category: str | None = None) -> dict[str, Any]:
        """The chat-completions request body (greedy by default, token ids returned)."""
        body: dict[str, Any] = {"model": model, "messages": self.messages, "max_tokens": self.max_tokens,
                                "temperature": temperature, "return_token_ids": True, **self.extra}
        name = category or (self.category if self.explicit_category else None)
        if name is not None:
            body["vllm_xargs"] = {"specctl_category": name}
        if logprobs is not None:
            body["logprobs"] = True
            body["top_logprobs"] = logprobs
        return body


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _make(category: str, i: int, rng: random.Random) -> Prompt:
    pid = f"{category}-{i}"
    if category == "prose":
        return Prompt(pid, category, _user(f"Write a short story about {rng.choice(_SUBJECTS)}."))
    if category == "json":
        name, age, city = rng.choice(_PEOPLE)
        return Prompt(pid, category, _user(
            f'Return only this JSON object, unchanged: {{"name": "{name}", "age": {age}, "city": "{city}", '
            f'"tags": ["{city.lower()}", "person"]}}'))
    if category == "structured":
        name, age, city = rng.choice(_PEOPLE)
        return Prompt(pid, category, _user(f"{name} is {age} years old and lives in {city}. Describe {name} as JSON."),
                      explicit_category=False, extra={"response_format": _PERSON_SCHEMA})
    if category == "code":
        return Prompt(pid, category, _user(f"Write a Python function that {rng.choice(_TASKS)}."))
    if category == "code_edit":
        code, ask = _SNIPPETS[i % len(_SNIPPETS)]
        return Prompt(pid, category, _user(f"{ask}\n\n```python\n{code}```"), max_tokens=96)
    if category == "tool_call":
        _, _, city = rng.choice(_PEOPLE)
        return Prompt(pid, category, _user(f"What is the weather in {city} today? Use the tools."),
                      explicit_category=False, extra={"tools": _TOOLS, "tool_choice": "auto"})
    if category == "summarise":
        return Prompt(pid, category, _user(f"Summarise in two sentences:\n\n{_PASSAGES[i % len(_PASSAGES)]}"))
    if category == "multi_turn":
        subject = rng.choice(_SUBJECTS)
        return Prompt(pid, category, [
            {"role": "user", "content": f"Give me three facts about {subject}."},
            {"role": "assistant", "content": f"1. {subject.capitalize()} is interesting. 2. Many stories mention "
                                             f"{subject}. 3. People remember {subject}."},
            {"role": "user", "content": "Now repeat the three facts as a numbered list and add a fourth one."},
        ])
    raise ValueError(f"unknown category {category!r}")


def build_workload(per_category: int = 2, categories: Sequence[str] = CATEGORIES, seed: int = 0,
                   max_tokens: int | None = None) -> list[Prompt]:
    """``per_category`` prompts of each category, interleaved (a mixed batch from the first requests on)."""
    rng = random.Random(seed)
    prompts = [_make(c, i, rng) for i in range(per_category) for c in categories]
    if max_tokens is not None:
        prompts = [Prompt(p.id, p.category, p.messages, max_tokens, p.explicit_category, p.extra) for p in prompts]
    return prompts


@dataclass
class Result:
    prompt: Prompt
    status: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    top_logprobs: list[list[tuple[int | str, float]]] = field(default_factory=list)
    latency_s: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


def _parse(prompt: Prompt, response: httpx.Response, latency: float) -> Result:
    if response.status_code != 200:
        return Result(prompt, response.status_code, latency_s=latency, error=response.text[:500])
    choice = response.json()["choices"][0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    if message.get("tool_calls"):
        text += repr(message["tool_calls"])
    tops = []
    for entry in (choice.get("logprobs") or {}).get("content") or []:
        tops.append([(t["token"], t["logprob"]) for t in entry.get("top_logprobs", [])])
    return Result(prompt, 200, token_ids=list(choice.get("token_ids") or []), text=text,
                  finish_reason=choice.get("finish_reason"), top_logprobs=tops, latency_s=latency)


def run_workload(base_url: str, prompts: Iterable[Prompt], *, model: str = "smollm2", concurrency: int = 4,
                 timeout_s: float = 300.0, **body_options: Any) -> list[Result]:
    """Send every prompt to ``/v1/chat/completions`` with up to ``concurrency`` in flight; results in order."""
    prompts = list(prompts)
    with httpx.Client(base_url=base_url, timeout=timeout_s) as client:
        def one(prompt: Prompt) -> Result:
            started = time.monotonic()
            try:
                response = client.post("/v1/chat/completions", json=prompt.body(model, **body_options))
            except httpx.HTTPError as exc:
                return Result(prompt, 0, latency_s=time.monotonic() - started, error=f"{type(exc).__name__}: {exc}")
            return _parse(prompt, response, time.monotonic() - started)

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(one, prompts))
