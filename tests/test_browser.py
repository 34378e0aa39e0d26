"""The web pages in a real browser: Debian's Chromium driven by Playwright."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

# 300 s: the first test also sets up `served` (a campaign, and in a run of the system tier
# the process's first Spark session) and Chromium
pytestmark = [pytest.mark.integration, pytest.mark.system, pytest.mark.timeout(300),
              pytest.mark.parallel, pytest.mark.xdist_group("served")]

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Chromium is missing: run `make install`"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


def test_login_then_report_renders_every_plot_with_data(served, browser):
    campaign_id = served.finished["id"]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{served.url}/campaigns/{campaign_id}")
    assert "/login" in page.url  # not logged in yet

    page.fill("input[name=token]", served.user_token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{served.url}/campaigns/{campaign_id}")
    page.wait_for_function("document.querySelectorAll('.plot .main-svg').length > 0")

    plots = page.eval_on_selector_all(
        ".plot", """divs => divs.map(d => ({id: d.id,
            traces: (d.data || []).length,
            points: (d.data || []).reduce((n, t) => n + ((t.y || []).filter(
                v => v !== null && v !== undefined).length), 0)}))""")
    ids = {p["id"] for p in plots}
    assert {"plot-latency-cdf", "plot-sync-spread", "plot-latency-time",
            "plot-delivery"} <= ids
    for plot in plots:
        assert plot["traces"] > 0 and plot["points"] > 0, plot
    summary_rows = page.locator("#summary tbody tr").count()
    assert summary_rows == 2
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    page.close()


def test_a_report_opened_while_running_shows_analysing_then_the_stats(served, browser,
                                                                       monkeypatch):
    from mqttbed.controller import lifecycle

    real_analysis = lifecycle.analyze_campaign
    page_saw_analysing = threading.Event()

    def held_analysis(*args, **kwargs):
        # held until the page has shown "analysing" (however long its load and 2 s poll
        # take), then released at once
        page_saw_analysing.wait(timeout=60)
        return real_analysis(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "analyze_campaign", held_analysis)
    spec = {"name": "watched", "agents": {"count": 1},
            "workload": {"subscribers": 2, "rate_hz": 200, "messages": 400,
                         "warmup_messages": 0}}
    with served.client() as http:
        campaign_id = http.post("/api/v1/campaigns", json=spec).json()["id"]
        http.post(f"/api/v1/campaigns/{campaign_id}/start")
    context = browser.new_context()
    context.add_cookies([{"name": "mqttbed_token", "value": served.user_token,
                          "url": served.url}])
    page = context.new_page()
    # every status the page shows, across its reload
    page.add_init_script("""window.addEventListener("DOMContentLoaded", () => {
        const seen = JSON.parse(sessionStorage.getItem("seen") || "[]");
        const status = document.getElementById("status");
        const note = () => { if (seen[seen.length - 1] !== status.textContent)
            seen.push(status.textContent); sessionStorage.setItem("seen", JSON.stringify(seen)); };
        note(); new MutationObserver(note).observe(status, {childList: true});
    });""")
    page.goto(f"{served.url}/campaigns/{campaign_id}")
    try:
        page.wait_for_function(
            "document.getElementById('status')?.textContent === 'analysing'", timeout=60_000)
    finally:
        page_saw_analysing.set()
    page.wait_for_selector("#summary tbody tr", timeout=100_000)
    seen = page.evaluate("JSON.parse(sessionStorage.getItem('seen'))")
    assert seen[-2:] == ["analysing", "done"], seen
    assert page.inner_text("#status") == "done"
    context.close()


def test_index_lists_campaigns_with_live_status(served, browser):
    context = browser.new_context()
    context.add_cookies([{"name": "mqttbed_token", "value": served.user_token,
                          "url": served.url}])
    page = context.new_page()
    page.goto(f"{served.url}/")
    page.wait_for_selector("#campaigns tbody tr")
    text = page.inner_text("#campaigns")
    assert served.finished["id"] in text and "done" in text
    context.close()


def test_a_wrong_token_does_not_log_in(served, browser):
    page = browser.new_page()
    page.goto(f"{served.url}/login")
    page.fill("input[name=token]", "mqb_not-a-token")
    page.click("button[type=submit]")
    assert "not a valid user token" in page.inner_text("body")
    page.close()


def test_cloud_edge_simulation_page_draws_figs_8_and_9_with_the_paper_beside(served, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": "mqttbed_token", "value": served.user_token,
                          "url": served.url}])
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{served.url}/simulations/cloud-edge?seed=1&units=1000")
    page.wait_for_function("document.querySelectorAll('.plot .main-svg').length >= 3")
    plots = page.eval_on_selector_all(
        ".plot", "divs => divs.map(d => ({id: d.id, names: (d.data || []).map(t => t.name)}))")
    assert [p["id"] for p in plots] == ["plot-policies", "plot-threshold-sweep",
                                        "plot-tq-sweep"]
    assert "paper: historic ≈ baseline − 3.5 s" in plots[0]["names"]
    assert "conservative (TQ 5 s)" in plots[2]["names"]
    assert page.locator("#claims tbody tr").count() == 9 and errors == []
    page.fill("input[name=seed]", "2")
    page.click("button[type=submit]")
    page.wait_for_url("**/simulations/cloud-edge?seed=2&units=1000")
    assert "seed 2, 1000 units" in page.inner_text("h1")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "cloud-edge-simulation.png"), full_page=True)
    context.close()
