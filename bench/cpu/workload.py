"""The benchmark's mixed workload: bench/support/workload.py's prompts, made distinct and larger.

``build_workload`` draws each category's prompt from a handful of templates, so at benchmark sizes most
prompts repeat (identical greedy outputs), and the benchmark would measure fewer distinct requests than it
sends. :func:`bench_workload` keeps every distinct prompt of ``build_workload`` and fills each category up
with variants built from the larger pools below -- same category, same request shape (explicit or derived
category, ``response_format``, tools) and the same ``max_tokens`` -- so every prompt is distinct.
``exclude`` keeps a warm-up set disjoint from the measured one. Deterministic for given arguments.
"""

from __future__ import annotations

import json
import random

from bench.support.workload import CATEGORIES, Prompt, build_workload

SUBJECTS = ["a retired pilot", "a beekeeper in the Alps", "a teenage inventor", "a haunted train station",
            "a baker who works at night", "a river that changed course", "a chess club in a small town",
            "a satellite that lost contact", "a painter who went blind", "an island with one tree",
            "a street musician in Lisbon", "a family of otters", "a detective who hates coffee",
            "a forgotten umbrella", "a volcano observatory", "a school for dragons", "a night-shift nurse",
            "a glass-blower", "a tiny robot vacuum", "an abandoned lighthouse café"]
PEOPLE = [("Ines", 29, "Lisbon"), ("Jonas", 38, "Oslo"), ("Kofi", 46, "Accra"), ("Lena", 22, "Vienna"),
          ("Mateo", 33, "Lima"), ("Nadia", 57, "Cairo"), ("Oskar", 41, "Stockholm"), ("Priya", 26, "Pune"),
          ("Quinn", 36, "Dublin"), ("Rosa", 63, "Seville"), ("Sami", 19, "Helsinki"), ("Tariq", 48, "Amman"),
          ("Uma", 31, "Chennai"), ("Viktor", 52, "Prague"), ("Wen", 44, "Taipei"), ("Yara", 28, "Beirut")]
TASKS = ["sorts a list of tuples by their second element", "flattens a nested list",
         "checks whether two strings are anagrams", "computes the greatest common divisor of two numbers",
         "counts the vowels in a string", "returns the largest element of a list without using max",
         "transposes a matrix given as a list of lists", "checks whether a number is prime",
         "converts a binary string to an integer", "groups words by their first letter",
         "returns the second largest number in a list", "capitalises the first letter of every word",
         "computes the running sum of a list", "finds the most common element in a list",
         "reverses the words in a sentence", "checks whether a list is sorted"]
SNIPPETS = [
    ("def greet(name):\n    print('Hello, ' + name)\n\n\ndef bye(name):\n    print('Bye, ' + name)\n",
     "Change both functions to return the string instead of printing it. Return the whole file."),
    (("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        "
      "self.items.append(x)\n"),
     "Add pop and peek methods that raise IndexError on an empty stack. Return the whole class."),
    ("total = 0\nfor n in numbers:\n    if n > 0:\n        total += n\nprint(total)\n",
     "Turn this into a function sum_positive(numbers) that returns the total. Keep the logic."),
    ("def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef spread(xs):\n    return max(xs) - min(xs)\n",
     "Make both functions return None for an empty list. Return the whole file."),
    ("import json\n\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n",
     "Add a save(path, data) function that writes the data as indented JSON. Return the whole file."),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
     "Add a __repr__ method and a distance_to(other) method. Return the whole class."),
    ("def is_even(n):\n    if n % 2 == 0:\n        return True\n    else:\n        return False\n",
     "Simplify this function to a single return statement, and add a matching is_odd function."),
    ("names = ['ann', 'bob', 'cy']\nfor i in range(len(names)):\n    print(i, names[i])\n",
     "Rewrite the loop with enumerate and print the names capitalised. Return the whole snippet."),
]
PASSAGES = [
    ("The town library will extend its opening hours from next month. It will open at eight in the morning "
     "and close at ten at night on weekdays. The change follows a survey in which most residents asked for "
     "later hours. Extra staff will be hired, and the reading room will get new lamps and more power outlets."),
    ("Honeybees communicate through a waggle dance. A bee that found food returns to the hive and moves in a "
     "figure-eight pattern. The angle of the dance shows the direction of the food relative to the sun, and "
     "the length of the waggle shows the distance. Other bees follow the dance and then fly to the food."),
    ("The regional train company announced new night trains between the capital and the coast. The trains "
     "will run three times a week in summer and once a week in winter. Each train has sleeping cars and a "
     "small restaurant. Tickets go on sale in April, and children under twelve travel at half price."),
    ("A volcano is an opening in the Earth's crust through which molten rock, ash and gases escape. When "
     "pressure from gases in the magma builds up, an eruption can occur. Some volcanoes erupt explosively, "
     "while others release lava slowly. Scientists monitor earthquakes and gas emissions to predict eruptions."),
    ("The school board approved a plan to plant two hundred trees around its buildings. Students will help "
     "with the planting on two Saturdays in October. The trees will give shade in summer and reduce noise from "
     "the road. Local nurseries donated half of the trees, and the rest will be paid for by a parents' fund."),
    ("Recycling turns used materials into new products. Paper is pulped and pressed into new sheets, glass is "
     "melted and reshaped, and metals are melted and cast again. Recycling saves energy and raw materials, but "
     "only works well when people sort their waste correctly and avoid putting food in recycling bins."),
]
CITIES = ["Lisbon", "Oslo", "Accra", "Vienna", "Lima", "Cairo", "Stockholm", "Pune", "Dublin", "Seville",
          "Helsinki", "Amman", "Chennai", "Prague", "Taipei", "Beirut"]


STORY_FORMS = ["Write a short story about {}.", "Write a short poem about {}.", "Describe {} in one paragraph."]
STRUCTURED_ASKS = ["Describe {n} as JSON.", "Give {n}'s details as JSON."]
CODE_ASKS = ["Write a Python function that {}.", "Write a short Python function that {}. Include a docstring."]
EDIT_SUFFIXES = ["", " Use four spaces for indentation.", " Do not add comments."]
WEATHER_ASKS = ["What is the weather in {} today? Use the tools.", "Is it raining in {} right now? Use the tools.",
                "What is the temperature in {} in Celsius? Use the tools."]
SUMMARY_STYLES = ["in two sentences", "in one sentence", "in three short bullet points",
                  "for a ten-year-old, in two sentences"]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _like(prompt: Prompt, messages: list[dict], pid: str) -> Prompt:
    """Same category, request shape and max_tokens as ``prompt``; new messages."""
    return Prompt(pid, prompt.category, messages, prompt.max_tokens, prompt.explicit_category, prompt.extra)


def _texts(category: str) -> list[list[dict]]:
    """Every variant's messages for one category (the product of the pools above)."""
    if category == "prose":
        return [_user(f.format(s)) for s in SUBJECTS for f in STORY_FORMS]
    if category == "json":
        return [_user(f'Return only this JSON object, unchanged: {{"name": "{n}", "age": {a}, "city": "{c}", '
                      f'"tags": ["{c.lower()}", "person"]{extra}}}')
                for n, a, c in PEOPLE for extra in ("", f', "id": {a * 7 % 100}')]
    if category == "structured":
        return [_user(f"{n} is {a} years old and lives in {c}. " + ask.format(n=n))
                for n, a, c in PEOPLE for ask in STRUCTURED_ASKS]
    if category == "code":
        return [_user(ask.format(t)) for t in TASKS for ask in CODE_ASKS]
    if category == "code_edit":
        return [_user(f"{ask}{suffix}\n\n```python\n{code}```") for code, ask in SNIPPETS for suffix in EDIT_SUFFIXES]
    if category == "tool_call":
        return [_user(ask.format(c)) for c in CITIES for ask in WEATHER_ASKS]
    if category == "summarise":
        return [_user(f"Summarise {style}:\n\n{p}") for p in PASSAGES for style in SUMMARY_STYLES]
    if category == "multi_turn":
        return [[{"role": "user", "content": f"Give me three facts about {s}."},
                 {"role": "assistant", "content": f"1. {s.capitalize()} is interesting. 2. Many stories mention {s}. "
                                                  f"3. People remember {s}."},
                 {"role": "user", "content": "Now repeat the three facts as a numbered list and add a fourth one."}]
                for s in SUBJECTS]
    raise ValueError(f"unknown category {category!r}")


def key(p: Prompt) -> str:
    return json.dumps([p.category, p.messages, p.extra], sort_keys=True)


def bench_workload(per_category: int, seed: int = 0, categories: tuple[str, ...] = CATEGORIES,
                   exclude: set[str] | frozenset[str] = frozenset()) -> list[Prompt]:
    """``per_category`` distinct prompts per category (none whose :func:`key` is in ``exclude``), interleaved
    like ``build_workload``: the first of every category, then the second of every category, ..."""
    rng = random.Random(seed + 7919)
    base = build_workload(per_category=per_category, categories=categories, seed=seed)
    seen = set(exclude)
    chosen: dict[str, list[Prompt]] = {c: [] for c in categories}
    for p in base:
        if key(p) not in seen and len(chosen[p.category]) < per_category:
            seen.add(key(p))
            chosen[p.category].append(p)
    for c in categories:
        template = next(p for p in base if p.category == c)
        pool = _texts(c)
        rng.shuffle(pool)
        for i, messages in enumerate(pool):
            if len(chosen[c]) >= per_category:
                break
            p = _like(template, messages, f"{c}-v{i}")
            if key(p) not in seen:
                seen.add(key(p))
                chosen[c].append(p)
        if len(chosen[c]) < per_category:
            raise ValueError(f"only {len(chosen[c])} distinct {c} prompts available, {per_category} asked")
    return [chosen[c][i] for i in range(per_category) for c in categories]


def chunk_size(c: int) -> int:
    """Prompts per alternation chunk: one per category per 4 concurrent requests (16 at c=8, 8 at c=1), long
    enough to hold the concurrency, short enough that load changes on the machine hit both sides alike."""
    return len(CATEGORIES) * max(1, c // 4)
