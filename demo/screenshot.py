"""Screenshots of a running app for the README (needs Python playwright and a Chromium):

    python app.py &            # serving the checkpoint you want to show
    python -m demo.screenshot --url http://127.0.0.1:7860 --out docs/screenshot.png

Clicks the first bundled example, summarizes it, and saves the Summarize tab (`--out`) and the
Attention tab (`--attention`, optional)."""
from __future__ import annotations

import argparse
import shutil
import sys

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# The stats line is written with the last tokens; the buttons swap back (Summarize on, Stop off) just after.
DONE = (
    "() => (document.querySelector('#summary-stats')?.innerText || '').includes('tokens/s')"
    " && !document.querySelector('#summarize-btn')?.disabled"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:7860")
    p.add_argument("--out", default="docs/screenshot.png")
    p.add_argument("--attention", default="", help="also save the Attention tab here")
    p.add_argument("--example", default="A Pennsylvania community", help="text on the example button to click")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=1000)
    a = p.parse_args(argv)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("error: needs Python playwright (pip install playwright) and a Chromium.", file=sys.stderr)
        return 2
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=a.chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": a.width, "height": a.height})
            page.goto(a.url)
            page.wait_for_selector("#summarize-btn", timeout=60_000)
            page.get_by_text(a.example, exact=False).first.click()
            page.wait_for_function("() => (document.querySelector('#article textarea')?.value || '').length > 0")
            page.click("#summarize-btn")
            page.wait_for_function(DONE, timeout=300_000)
            page.wait_for_timeout(800)  # the re-enabled Summarize button fades back in: shoot it settled
            page.screenshot(path=a.out)
            print(f"wrote {a.out}")
            if a.attention:
                page.get_by_role("tab", name="Attention").click()
                page.wait_for_selector("#attention-plot .js-plotly-plot", timeout=120_000)
                page.wait_for_timeout(1500)
                page.screenshot(path=a.attention, full_page=True)
                print(f"wrote {a.attention}")
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
