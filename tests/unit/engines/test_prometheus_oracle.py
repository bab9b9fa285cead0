"""The tuner's ``/metrics`` reader against ``prometheus_client``'s parser, the library the engines
export with: the same samples, keyed the same way, on every page captured from a real engine and on
generated pages with the escapes, braces and special values the text format allows.

The tuner keeps its own reader because it is many times faster on an engine's page and a step samples
the page about once a second beside the requests it times (reports/measurement.md, "Reading /metrics").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tuner.engines.prometheus import parse_prometheus

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "captures"


def oracle(text: str) -> dict[str, float]:
    """``prometheus_client``'s reading, keyed as the tuner keys a sample: ``name{labels as written}``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[key(sample.name, sample.labels)] = float(sample.value)
    return out


def key(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def same(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def test_every_captured_engine_page_reads_as_prometheus_client_reads_it() -> None:
    pages = sorted(CAPTURES.rglob("*.prom"))
    assert len(pages) >= 10  # both engines' H200 captures
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert same(parse_prometheus(text), oracle(text)), page


# names a typed family would rename (a counter's _total, a histogram's parts) stay out: the pages are gauges
NAMES = st.from_regex(r"[a-z_:][a-z0-9_:]{0,20}", fullmatch=True).filter(
    lambda n: not n.endswith(("_total", "_created"))
)
LABEL_NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
LABEL_VALUES = st.text(alphabet=st.sampled_from(list('ab }{",=\\\n\t+-.0')), max_size=12)
VALUES = st.one_of(
    st.floats(allow_nan=False, width=64).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "0", "17", "1e-3"]),
)


@st.composite
def pages(draw: st.DrawFn) -> str:
    lines = []
    for name in draw(st.lists(NAMES, min_size=1, max_size=6, unique=True)):
        lines.append(f"# TYPE {name} {draw(st.sampled_from(['gauge', 'untyped']))}")
        for _ in range(draw(st.integers(1, 3))):
            labels = draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=3))
            stamp = draw(st.sampled_from(["", " 1712345678000"]))
            lines.append(f"{key(name, labels)} {draw(VALUES)}{stamp}")
    return "\n".join(lines) + "\n"


@settings(deadline=None)  # what is compared is the samples, not the time: a busy machine must not fail it
@given(pages())
def test_generated_pages_read_as_prometheus_client_reads_them(text: str) -> None:
    assert same(parse_prometheus(text), oracle(text)), text
