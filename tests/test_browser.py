"""A real browser: headless Chromium (Debian's `chromium`) driven by Playwright loads the
app, summarizes an example, opens the Attention tab and saves a screenshot; Stop ends a long
beam search and a long evaluation without an "Error" badge; highlighted source words are
spaced as the text is, and the decoding checkboxes keep room for their help text whatever the
strategy. Skips with the reason where Playwright or Chromium is missing. Set B2B_SCREENSHOT_DIR
to keep the images."""
from __future__ import annotations

import contextlib
import os
import shutil

import pytest
from test_app_e2e import launch_app, write_tiny_checkpoint

CHROMIUM = os.environ.get("B2B_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@contextlib.contextmanager
def open_app(tmp_path, **config):
    """A page of app.py serving a tiny checkpoint (B2BConfig overrides in `config`), once the
    Summarize tab is up."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Python playwright (pip install playwright)")
    if not CHROMIUM:
        pytest.skip("needs Chromium (apt-get install chromium); set B2B_CHROMIUM to its path if elsewhere")
    watch = tmp_path / "logs"
    write_tiny_checkpoint(watch, 1, **config)
    with launch_app(watch, tmp_path / "app.log") as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            page.wait_for_selector("#summarize-btn", timeout=60_000)
            yield page
        finally:
            browser.close()


# The side margins of a word of the highlighted source once it is highlighted (a copy of a
# word, with Gradio's classes, given the class that a scored word gets).
HIGHLIGHTED_MARGINS = """() => {
    const word = document.querySelector('#attention-highlight .token');
    const copy = word.cloneNode(true);
    copy.classList.add('highlighted');
    word.parentElement.appendChild(copy);
    const style = getComputedStyle(copy);
    const margins = style.marginLeft + ' ' + style.marginRight;
    copy.remove();
    return margins;
}"""


def pick_example(page) -> None:
    page.get_by_text("A Pennsylvania community is pulling", exact=False).first.click()
    page.wait_for_function(  # the example fills the text box asynchronously
        "() => (document.querySelector('#article textarea')?.value || '').includes('Pennsylvania')", timeout=30_000
    )


def test_summarize_an_example_and_see_its_attention(tmp_path):
    with open_app(tmp_path) as page:
        assert "Serving" in page.inner_text("#header-status")
        pick_example(page)
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
        # A highlighted word is spaced as the text is, not by Gradio's margins ("3 -2"); a tiny
        # model may highlight nothing, so a word of the page is highlighted by hand.
        margins = page.evaluate(HIGHLIGHTED_MARGINS)
        assert margins == "0px 0px"
        shot = tmp_path / "attention.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000
        keep = os.environ.get("B2B_SCREENSHOT_DIR")
        if keep:
            os.makedirs(keep, exist_ok=True)
            shutil.copy(shot, os.path.join(keep, "attention.png"))


def set_number(page, label: str, value: int) -> None:
    """Type `value` into the visible number box labelled `label` (a slider's box too)."""
    box = page.locator(f"input[aria-label='{label}']:visible")
    box.fill(str(value))
    box.press("Tab")  # Gradio takes the value on blur


def text_of(elem_id: str, words: str) -> str:
    """A page function: true once the element's text holds `words`."""
    return f"() => (document.querySelector('#{elem_id}')?.innerText || '').includes('{words}')"


def stop_and_settle(page, run_id: str, stop_id: str, note_id: str) -> None:
    """Press Stop; wait for the stopped note and the run button to come back, and a moment more
    for a late update of the stopped run to land."""
    page.click(f"#{stop_id}")
    page.wait_for_function(text_of(note_id, "Stopped"), timeout=60_000)
    page.wait_for_function(f"() => !document.querySelector('#{run_id}').disabled", timeout=60_000)
    page.wait_for_timeout(1000)


def test_stop_keeps_what_was_written_and_shows_no_error(tmp_path):
    """Gradio's own cancel (`cancels=`) left a red "Error" badge over the partial summary and
    sometimes a stale "Generating… N tokens" line; Stop now asks the handler to end."""
    with open_app(tmp_path, max_positions=512) as page:  # room for a summary long enough to stop
        pick_example(page)
        page.get_by_text("Decoding settings").first.click()
        set_number(page, "number input for Beams", 16)
        set_number(page, "Min length (tokens)", 400)
        set_number(page, "Max length (tokens)", 500)
        page.click("#summarize-btn")
        page.wait_for_function(text_of("summary-stats", "Generating… "), timeout=60_000)
        page.wait_for_function("() => (document.querySelector('#summary textarea')?.value || '').trim()", timeout=60_000)
        stop_and_settle(page, "summarize-btn", "summarize-stop", "summary-stats")
        assert "unfinished" in page.inner_text("#summary-stats")
        assert page.input_value("#summary textarea").strip()  # what the search had written
        assert page.locator(".error:visible").count() == 0
        assert page.is_disabled("#summarize-stop")

        page.get_by_role("tab", name="ROUGE").click()
        set_number(page, "number input for N (first N articles)", 300)
        page.click("#rouge-btn")
        page.wait_for_function(text_of("rouge-summary", "Summarizing"), timeout=60_000)
        stop_and_settle(page, "rouge-btn", "rouge-stop", "rouge-summary")
        assert "no scores" in page.inner_text("#rouge-summary")
        assert page.locator(".error:visible").count() == 0


# The width of a decoding checkbox's block, by its label, on the tab on show.
CHECKBOX_WIDTH = """label => [...document.querySelectorAll('label')]
    .filter(l => l.offsetParent && l.innerText.trim().startsWith(label))
    .map(l => l.closest('.block').getBoundingClientRect().width)[0]"""


def test_decoding_checkboxes_keep_room_for_their_help_in_every_strategy(tmp_path):
    """Greedy and sampling hide three beam sliders: the checkboxes then got what the two sliders
    left, about 100 px, and their help text ran one or two words a line."""
    with open_app(tmp_path) as page:
        page.get_by_text("Decoding settings").first.click()
        for strategy in ("beam", "greedy", "sampling"):
            page.locator("label:visible", has_text=strategy).first.click()
            page.wait_for_timeout(500)  # the sliders hide or show
            for label in ("Block word stutter", "Spell words as the source does"):
                width = page.evaluate(CHECKBOX_WIDTH, label)
                assert width >= 240, (strategy, label, width)
