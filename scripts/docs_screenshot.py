"""Regenerate docs/img/report.png: the report of a small real campaign, seen in Chromium.

Runs a cut-down quickstart (Mosquitto, 1 publisher -> 2 and 10 subscribers, 2 repetitions)
with `mqttbed run`, writes its self-contained report with `mqttbed report`, opens it in
Debian's Chromium through Playwright (as tests/test_browser.py does) and saves the top
of the page as a PNG. About a minute here, most of it Spark.

    .venv/bin/python scripts/docs_screenshot.py [--out docs/img/report.png] [--keep DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SPEC = """\
name: docs-screenshot
description: the campaign whose report the README shows (scripts/docs_screenshot.py)
broker: {backend: mosquitto}
workload: {publishers: 1, subscribers: 2, topic: bench/sync, payload_bytes: 64,
           rate_hz: 100, messages: 200, qos: 0, warmup_messages: 20}
sweep:
  workload.subscribers: [2, 10]
repetitions: 2
"""


def run_campaign(data_dir: Path) -> Path:
    """Measure the campaign and write its report; return the report's path."""
    mqttbed = Path(sys.executable).with_name("mqttbed")
    spec = data_dir / "docs-screenshot.yaml"
    spec.write_text(SPEC)
    subprocess.run([str(mqttbed), "run", str(spec), "--data-dir", str(data_dir)], check=True)
    report = data_dir / "report.html"
    subprocess.run([str(mqttbed), "report", "latest", "--data-dir", str(data_dir),
                    "--out", str(report)], check=True)
    return report


def screenshot(report: Path, out: Path) -> None:
    """Open the report in Chromium, wait until its plots are drawn, save the viewport."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: run `make install`")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        page.goto(report.resolve().as_uri())
        page.wait_for_function("document.querySelectorAll('.plot .main-svg').length > 0")
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "report.png")
    parser.add_argument("--keep", type=Path, help="data dir to keep (default: a temporary one)")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        screenshot(run_campaign(args.keep), args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="mqttbed-screenshot-") as data_dir:
            screenshot(run_campaign(Path(data_dir)), args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
