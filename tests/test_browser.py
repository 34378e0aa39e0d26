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
    # every column of the summary in the 1,400-px window (its box scrolls no wider)
    summary = page.eval_on_selector(
        "#summary", "t => [t.parentElement.scrollWidth, t.parentElement.clientWidth]")
    assert summary[0] <= summary[1], summary
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


# The report at a glance (issue 42): a campaign of three scenarios × two sweep values × two
# repetitions, its figures as wide as a long, overloaded campaign's get (ten minutes at
# 1,000 messages/s to 50 subscribers: tens of millions of deliveries, up to 0.2 s of
# latency), its runs' $SYS samples from the deploy on, 10 s before each run's start. A
# results document written for the layout: the figures are not the test's subject, the
# page's geometry is.
GLANCE_SCENARIOS = ("mosquitto-qos0", "mosquitto-qos1-at-least-once",
                    "mosquitto-qos2-exactly-once")
GLANCE_SUBSCRIBERS = (10, 500)
GLANCE_REPETITIONS = 2


def glance_distribution(p50: float, **extra) -> dict:
    return {"count": 2_500_000, "mean": p50 * 1.1, "std": p50 / 3, "p50": p50,
            "p90": p50 * 2, "p99": p50 * 4, "p999": p50 * 9, "max": p50 * 20, **extra}


def glance_results(campaign_id: str):
    """The results document of the glance campaign: its points, runs and series."""
    from datetime import UTC, datetime

    from mqttbed.controller.analysis import results_type

    points, runs, timeline, sys_topics, cdf = [], [], {}, {}, {}
    clock = {"max_fraction_of_spread": 0.1, "flagged": False}
    combinations = [(s, n) for s in GLANCE_SCENARIOS for n in GLANCE_SUBSCRIBERS]
    for index, (scenario, subscribers) in enumerate(combinations):
        params = {"scenario": scenario, "workload.subscribers": subscribers}
        p50 = 1234.5 * (index + 1) ** 2   # to 44 ms; its p99.9 to 0.4 s
        run_ids = [f"{campaign_id}-r{index * GLANCE_REPETITIONS + rep:04d}"
                   for rep in range(GLANCE_REPETITIONS)]
        points.append({
            "point_index": index, "backend": "mosquitto", "params": params, "run_ids": run_ids,
            "runs": GLANCE_REPETITIONS, "runs_failed": 1, "partial": True, "sections": {},
            "messages_sent": 600_000, "deliveries_expected": 30_000_000,
            "deliveries_received": 28_765_432, "lost": 1_234_568, "duplicates": 12_345,
            "reordered": 234_567,
            "latency_us": glance_distribution(p50, p50_ci=[p50 * 0.9, p50 * 1.2],
                                              p99_ci=[p50 * 3.5, p50 * 4.5]),
            "latency_from_intended_us": glance_distribution(p50 * 1.5),
            "send_lag_us": glance_distribution(p50 / 2),
            "jitter_us": {"std": p50 / 3, "rfc3550": p50 / 4},
            "sync_spread_us": glance_distribution(p50 / 5, p50_ci=[p50 / 6, p50 / 4]),
            "first_last_spread_us": glance_distribution(p50 / 7),
            "throughput_msgs_per_s": 123_456.7,
            "broker": {"cpu_percent_mean": 187.4, "cpu_percent_std": 12.3,
                       "rss_bytes_max": 3_456_789_012}})
        cdf[str(index)] = [p50 * (1 + q / 25) for q in range(101)]
        for rep, run_id in enumerate(run_ids):
            runs.append({"run_id": run_id, "point_index": index, "repetition": rep,
                         "params": params, "backend": "mosquitto", "state": "done",
                         "clock": clock, "sections": {}})
            seconds = [t / 10 for t in range(60)]
            timeline[run_id] = {"t_s": seconds, "p50_us": [p50] * 60, "p99_us": [p50 * 4] * 60,
                                "deliveries": [1000] * 60}
            deploy_to_end = list(range(-10, 7))   # one $SYS update a second
            sys_topics[run_id] = {
                f"$SYS/broker/messages/{direction}": {
                    "t_s": [float(t) for t in deploy_to_end],
                    "value": [float(factor * 1000 * (t + 10) * (index + 1))
                              for t in deploy_to_end]}
                for direction, factor in (("received", 1), ("sent", subscribers))}
    return results_type().model_validate({
        "campaign": {"id": campaign_id}, "generated_at": datetime.now(UTC), "points": points,
        "runs": runs, "series": {"latency_cdf_us": cdf, "latency_timeline": timeline,
                                 "sys_topics": sys_topics}})


def boxes(page, selector: str) -> list[dict]:
    """The bounding boxes of the elements ``selector`` matches, in page pixels."""
    return page.eval_on_selector_all(selector, """elements => elements.map(e => {
        const r = e.getBoundingClientRect();
        return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; })""")


def overlap(a: dict, b: dict) -> bool:
    return (a["left"] < b["right"] and b["left"] < a["right"]
            and a["top"] < b["bottom"] and b["top"] < a["bottom"])


def test_a_report_of_twelve_runs_fits_a_1400_px_window_with_every_legend_readable(
        controller, browser, tmp_path):
    """The summary table needs no horizontal scrolling at 1,400 × 900; the $SYS plot
    starts at the runs' start though its samples begin 10 s before; plots of twelve runs
    keep each legend entry apart, out of the plot area, and in its own colour."""
    from mqttbed.analytics.results_files import write_stats
    from mqttbed.api.report import render_report
    from mqttbed.campaigns.spec import parse_spec

    campaign_id = controller.engine.create_campaign(parse_spec({
        "name": "glance", "scenarios": [{"name": s} for s in GLANCE_SCENARIOS],
        "sweep": {"workload.subscribers": list(GLANCE_SUBSCRIBERS)},
        "repetitions": GLANCE_REPETITIONS}))
    document = glance_results(campaign_id)
    assert len(document.runs) >= 9
    write_stats(document, controller.layout.campaign_dir(campaign_id))
    report = tmp_path / "report.html"
    report.write_text(render_report(controller, campaign_id, standalone=True))

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(report.as_uri())
    page.wait_for_function("document.querySelectorAll('.plot .main-svg').length > 0")
    assert errors == []

    # 1. every column of the summary within the window, every figure shown
    fit = page.eval_on_selector("#summary", """t => ({
        scroll: t.parentElement.scrollWidth, client: t.parentElement.clientWidth,
        right: t.getBoundingClientRect().right, window: document.documentElement.clientWidth,
        columns: t.querySelectorAll("thead th").length,
        cells: [...t.querySelectorAll("tbody tr")].map(r => r.cells.length)})""")
    assert fit["scroll"] <= fit["client"] and fit["right"] <= fit["window"], fit
    assert fit["cells"] == [fit["columns"]] * len(GLANCE_SCENARIOS) * len(GLANCE_SUBSCRIBERS)
    text = page.inner_text("#summary")
    assert "28765432" in text   # a figure is never cut or wrapped
    assert "44442" in text and "44442.0" not in text   # from 10 ms on, whole µs
    assert "scenario=mosquitto-qos2-exactly-once, subscribers=500" in " ".join(text.split())

    # 2. the $SYS plot: its x axis starts at the run's start, not at the deploy
    sys_plot = page.eval_on_selector("#plot-sys-rates", """d => ({
        range: d.layout.xaxis.range, x: d.data.flatMap(t => t.x)})""")
    assert min(sys_plot["x"]) >= 0
    assert 0 <= sys_plot["range"][0] <= min(sys_plot["x"]), sys_plot["range"]

    # 3. legends of twelve runs: below the plot area, entries apart and distinct in colour
    for plot_id in ("plot-latency-time", "plot-sys-rates"):
        plot = f"#{plot_id}"
        (area,) = boxes(page, f"{plot} .nsewdrag")
        (x_title,) = boxes(page, f"{plot} .g-xtitle")
        svg = boxes(page, f"{plot} .main-svg")[0]   # (the second: the hover layer)
        entries = boxes(page, f"{plot} .legend .traces")
        assert len(entries) == len(document.runs), plot_id
        for i, entry in enumerate(entries):
            assert not overlap(entry, area) and not overlap(entry, x_title), (plot_id, i)
            assert entry["bottom"] <= svg["bottom"], (plot_id, i)   # shown, not scrolled away
            assert not any(overlap(entry, other) for other in entries[i + 1:]), (plot_id, i)
        assert area["bottom"] - area["top"] >= 250, plot_id   # the plot kept its height
        colours = page.eval_on_selector_all(
            f"{plot} .legend .traces .legendlines path",
            "paths => paths.map(p => getComputedStyle(p).stroke)")
        assert len(set(colours)) == len(document.runs), (plot_id, colours)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report-twelve-runs.png"), full_page=True)
    page.close()
