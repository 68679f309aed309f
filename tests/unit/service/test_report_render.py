"""The report as a person sees it: rendered by headless Chromium, nothing overlaps (chart labels, legends, lines,
cards), human units, whole-number k ticks, the decision text and its table agree. The screenshot is kept as a test
artifact (``$SPECCTL_ARTIFACTS``, default ``.cache/test-artifacts``; docs/report.png is one of them)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from specctl_vllm.controller import report
from tests.unit.service.test_report import recording

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = Path(os.environ.get("SPECCTL_ARTIFACTS", REPO / ".cache" / "test-artifacts"))
#: what the controller's GET /v1/overrides answers (raw values the page must not print as they are)
OVERRIDES = [{"category": "code", "k": 2, "method": None, "off": False, "expires_at": None, "reason": "incident 12",
              "actor": "alice", "created_at": 1796460111.2388544, "kinds": ["k"], "ttl_remaining_s": None},
             {"category": "chat", "k": None, "method": None, "off": True, "expires_at": 1796463711.2388544,
              "reason": "drafter slow", "actor": "bob", "created_at": 1796460111.0, "kinds": ["off"],
              "ttl_remaining_s": 3600.0}]

#: runs in the page (a copy; the report itself has no script): every pair of boxes that must not overlap
CHECK = """<script>
const box = e => e.getBoundingClientRect();
const hit = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5 &&
                      Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5;
const found = [];
document.querySelectorAll("svg").forEach((svg, n) => {
  const texts = [...svg.querySelectorAll(":scope > text")];
  const lines = [...svg.querySelectorAll("polyline, circle")];
  texts.forEach((t, i) => {
    texts.slice(i + 1).forEach(u => { if (hit(box(t), box(u))) found.push(`svg ${n}: "${t.textContent}" / "${u.textContent}"`); });
    lines.forEach(l => { if (hit(box(t), box(l))) found.push(`svg ${n}: "${t.textContent}" over a line`); });
    const s = box(svg), b = box(t);
    if (b.left < s.left - 0.5 || b.right > s.right + 0.5 || b.top < s.top - 0.5 || b.bottom > s.bottom + 0.5)
      found.push(`svg ${n}: "${t.textContent}" outside its chart`);
  });
});
const cards = [...document.querySelectorAll(".card")];
cards.forEach((c, i) => cards.slice(i + 1).forEach(d => { if (hit(box(c), box(d))) found.push("two cards overlap"); }));
const out = document.createElement("pre"); out.id = "overlaps"; out.textContent = JSON.stringify(found);
document.body.appendChild(out);
</script>"""


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    assert found, "the rendering test needs headless Chromium: apt-get install chromium (.ci/run installs it)"
    return found


def _page(series: int = 0) -> str:
    """The page of a recording; ``series`` more categories in "k that ran" (a legend of several rows, lines at
    the top of the chart: where a legend drawn inside the plot area lands on them)."""
    data = report.from_recording(recording(), generated_at=1796460200.0, source="r.jsonl")
    data["overrides"] = OVERRIDES
    data["timeline"] += [{"t_s": float(t), "category": f"extra-{i}", "k": 4 - (t + i) % 2, "method": "ngram",
                          "series": "ran"} for i in range(series) for t in range(0, 30, 3)]
    return report.render_html(data)


def _browser(args: list[str], page: Path) -> str:
    done = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1400,2400", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_nothing_overlaps_in_the_rendered_page(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(_page(series=4).replace("</body>", CHECK + "</body>"), encoding="utf-8")
    dom = _browser(["--dump-dom"], page)
    match = re.search(r'<pre id="overlaps">(.*?)</pre>', dom, re.DOTALL)
    assert match, "the check did not run"
    assert json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&")) == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    clean = tmp_path / "clean.html"
    clean.write_text(_page(), encoding="utf-8")
    shot = ARTIFACTS / "report.png"
    _browser([f"--screenshot={shot}"], clean)
    assert shot.stat().st_size > 10_000


def test_the_page_speaks_to_a_person() -> None:
    page = _page()
    overrides = page.split("<h2>Overrides</h2>", 1)[1].split("<h2>", 1)[0]
    for raw in ("1796460111.2388544", "None", "[&#x27;k&#x27;]", "False", "True"):
        assert raw not in overrides, raw
    assert "2026-12-05 " in overrides and "UTC" in overrides and "never" in overrides and "(in 1 h)" in overrides
    assert "span 15.1 s of engine time" in page or re.search(r"span [\d.]+ s of engine time", page)


def test_k_ticks_are_whole_numbers() -> None:
    page = _page()
    timeline = page.split("<h2>k and method over time</h2>", 1)[1].split("<h3>", 1)[0]
    ticks = re.findall(rf'<text x="{report.PAD_L - 5}" y="[\d.]+" text-anchor="end" class="n">([^<]+)</text>', timeline)
    assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks


def test_the_decision_text_is_the_tables_row() -> None:
    data = report.from_recording(recording(), generated_at=0.0)
    for view in data["categories"]:
        decision = view["decision"]
        row = report.decision_row(decision)
        section = report._category_section(view)
        assert row is not None
        assert f"estimated {row['speedup']:.2f}× plain decoding" in section
        assert f"<td>{row['speedup']:.2f}×</td>" in section
        assert str(decision["estimated_speedup"]) not in section.split("<table>", 1)[0] or \
            f"{row['speedup']:.2f}" == f"{decision['estimated_speedup']:.2f}"
