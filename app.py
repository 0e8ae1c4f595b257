"""Start the b2b Gradio app.

    python app.py [--watch logs] [--checkpoint DIR] [--host 127.0.0.1] [--port 7860]
                  [--share] [--auth user:pass] [--concurrency 2]

Serves the newest complete checkpoint under --watch and swaps in newer ones as training writes
them (or serves --checkpoint only). Drive it from Python with gradio_client:
`Client(url).predict("text", api_name="/summarize")`, `.predict(api_name="/model_info")`."""
from __future__ import annotations

import argparse
import logging
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import b2b  # noqa: E402,F401 - preloads the fast BLAS before anything imports mlx
from demo.store import BUNDLED, CheckpointStore  # noqa: E402
from demo.worker import ModelWorker  # noqa: E402

log = logging.getLogger("app")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument("--port", type=int, default=7860, help="port to listen on (default: 7860)")
    p.add_argument("--share", action="store_true", help="also open a public Gradio share link (needs the internet)")
    p.add_argument("--auth", default=None, metavar="USER:PASS", help="require this login")
    p.add_argument("--watch", default="logs", help="folder searched for the newest checkpoint (default: logs)")
    p.add_argument("--checkpoint", default=None, metavar="DIR", help="serve this checkpoint only (no switching)")
    p.add_argument("--fallback", default=BUNDLED, metavar="DIR",
                   help="served while --watch has no checkpoint ('' for none; default: demo/checkpoint)")
    p.add_argument("--concurrency", type=int, default=2, help="model requests worked on at once, the rest queue (default: 2)")
    p.add_argument("--queue-size", type=int, default=64, help="requests that may wait in the queue (default: 64)")
    p.add_argument("--poll-seconds", type=float, default=5.0, help="seconds between scans of --watch (default: 5)")
    a = p.parse_args(argv)
    if a.auth is not None and (":" not in a.auth or not a.auth.split(":", 1)[0] or not a.auth.split(":", 1)[1]):
        p.error("--auth must look like user:password.")
    if a.concurrency < 1:
        p.error("--concurrency must be at least 1.")
    if a.checkpoint and not os.path.isdir(a.checkpoint):
        p.error(f"--checkpoint {a.checkpoint} is not a folder.")
    return a


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    a = parse_args(argv)
    from demo.ui import CSS, THEME, build_app  # gradio: imported after the flags parsed

    store = CheckpointStore(
        a.watch, pinned=a.checkpoint, fallback=a.fallback or None, worker=ModelWorker(), poll_seconds=a.poll_seconds
    ).start()
    if store.current() is None:
        log.warning("No checkpoint to serve yet%s; the app opens and says how to train one.",
                    f" ({store.warning})" if store.warning else f" under {a.watch}")
    auth = tuple(a.auth.split(":", 1)) if a.auth else None
    if a.share and not auth:
        log.warning("--share without --auth: anyone with the link can use this app.")
    app = build_app(store, a.watch, a.concurrency)
    app.queue(default_concurrency_limit=a.concurrency, max_size=a.queue_size)
    try:
        app.launch(
            server_name=a.host, server_port=a.port, share=a.share, auth=auth, theme=THEME, css=CSS,
            show_error=False, max_file_size="200mb", footer_links=["api", "settings"], prevent_thread_lock=True,
        )
    except OSError as e:  # Gradio's "Cannot find empty port ...": say it in one sentence
        store.stop()
        if "port" not in str(e).lower():
            raise
        print(f"app.py: port {a.port} on {a.host} is in use (another app.py?): stop that, or pass another --port.",
              file=sys.stderr)
        return 2
    if a.share and not app.share_url:  # no network: Gradio gives up on the link, we keep serving
        log.warning("Could not create a share link; serving locally only at %s", app.local_url)
    try:
        app.block_thread()
    finally:
        store.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
