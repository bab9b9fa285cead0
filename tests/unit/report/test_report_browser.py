"""The report in headless Chromium: every Plotly figure draws, offline, with no console error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.report.html import write_report

pytestmark = pytest.mark.browser
DRAWN = (
    "return Array.from(document.querySelectorAll('.plotly-graph-div'))"
    ".map(d => [d.id, (d.data || []).length, d.querySelectorAll('.scatterlayer .trace').length])"
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--user-data-dir={tmp_path / 'chrome'}"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_window_size(1400, 3000)
    try:
        yield driver
    finally:
        driver.quit()


def _open(browser: Any, page: Path) -> dict[str, tuple[int, int]]:
    """Load the page; check it logged no error and fetched nothing; each figure's (traces, traces drawn)."""
    browser.get(page.as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert fetched == [], "the page loads nothing: plotly.js is inline"
    assert browser.save_screenshot(str(page.with_suffix(".png")))
    return {div: (traces, layers) for div, traces, layers in browser.execute_script(DRAWN)}


def test_a_capacity_report_draws_in_a_real_browser_with_no_network(
    capacity_study: optuna.Study, browser: Any, tmp_path: Path
) -> None:
    drawn = _open(browser, write_report(capacity_study, tmp_path / "reports"))
    assert set(drawn) == {"capacity-plot-0", "capacity-plot-1", "failure-map-plot"}
    assert all(traces > 0 and layers == traces for traces, layers in drawn.values()), drawn
    for section in ("capacity", "capacity-table", "importance", "best-vs-default", "launch"):
        assert browser.find_element("id", section).is_displayed(), section
    hover = browser.execute_script(
        "Plotly.Fx.hover('capacity-plot-0', [{curveNumber: 0, pointNumber: 1}]);"
        "return Array.from(document.querySelectorAll('#capacity-plot-0 .hovertext')).map(e => e.textContent)"
    )
    assert len(hover) == 1 and "trial 2 (vllm)4 req/s: passed" in hover[0], hover
    assert "vllm.memory_fraction=0.3vllm.max_num_seqs=64" in hover[0], "one parameter a line"


def test_a_pareto_report_draws_its_plots_in_a_real_browser(
    pareto_study: optuna.Study, browser: Any, tmp_path: Path
) -> None:
    """What tests/e2e's browser test checks on a real study, here with no engine to boot."""
    drawn = _open(browser, write_report(pareto_study, tmp_path / "reports"))
    assert set(drawn) == {"pareto-plot", "ttft-cdf-plot", "failure-map-plot"}
    assert all(traces > 0 and layers == traces for traces, layers in drawn.values()), drawn
    for section in ("pareto", "best-vs-default", "ttft-cdf", "importance", "failure-map", "acceptance", "launch"):
        assert browser.find_element("id", section).is_displayed(), section
    assert len(browser.find_elements("css selector", "svg")) >= 2
    assert browser.execute_script("return Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
