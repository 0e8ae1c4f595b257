"""A real browser: headless Chromium (Debian's `chromium`) driven by Playwright loads the
app, summarizes an example, opens the Attention tab and saves a screenshot. Skips with the
reason where Playwright or Chromium is missing. Set B2B_SCREENSHOT_DIR to keep the images."""
from __future__ import annotations

import os
import shutil

import pytest
from test_app_e2e import launch_app, write_tiny_checkpoint

CHROMIUM = os.environ.get("B2B_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def test_summarize_an_example_and_see_its_attention(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Python playwright (pip install playwright)")
    if not CHROMIUM:
        pytest.skip("needs Chromium (apt-get install chromium); set B2B_CHROMIUM to its path if elsewhere")
    watch = tmp_path / "logs"
    write_tiny_checkpoint(watch, 1)
    with launch_app(watch, tmp_path / "app.log") as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            page.wait_for_selector("#summarize-btn", timeout=60_000)
            assert "Serving" in page.inner_text("#header-status")

            page.get_by_text("A Pennsylvania community is pulling", exact=False).first.click()
            page.wait_for_function(  # the example fills the text box asynchronously
                "() => (document.querySelector('#article textarea')?.value || '').includes('Pennsylvania')", timeout=30_000
            )
            page.click("#summarize-btn")
            page.wait_for_function(
                "() => (document.querySelector('#summary-stats')?.innerText || '').includes('tokens/s')", timeout=60_000
            )
            assert page.input_value("#summary textarea").strip()
            assert "Truncated" in page.inner_text("#summary-stats")  # 500+ tokens into a 128-position model

            page.get_by_role("tab", name="Attention").click()
            page.wait_for_selector("#attention-plot .js-plotly-plot", timeout=60_000)
            page.wait_for_function(
                "() => (document.querySelector('#attention-highlight')?.innerText || '').includes('pennsylvania')",
                timeout=60_000,
            )
            shot = tmp_path / "attention.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 20_000
            keep = os.environ.get("B2B_SCREENSHOT_DIR")
            if keep:
                os.makedirs(keep, exist_ok=True)
                shutil.copy(shot, os.path.join(keep, "attention.png"))
        finally:
            browser.close()
