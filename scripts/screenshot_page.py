"""The README's picture of the translation page, from a model that translates.

Serves ``--checkpoint`` with `mt serve` on a free port of 127.0.0.1, opens the page in a headless
Chromium (Debian's chromium and chromedriver, driven by selenium: `make test-browser` installs
them), translates ``--line`` with ``--beam`` and ``--nbest``, waits for the heatmap and saves the
whole page as a PNG:

    .venv/bin/python scripts/screenshot_page.py --checkpoint runs/toy/best.pt \
        --line "The light friend saw the blue letter." --output docs/translation_page.png
"""

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: Path, port: int) -> subprocess.Popen:
    """`mt serve` on ``port``, once its model answers /health/ready."""
    process = subprocess.Popen(
        [sys.executable, "-m", "transformer_mt", "serve", "-c", str(checkpoint),
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2):
                return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                sys.exit(f"mt serve did not start: {process.communicate()[1][-2000:]}")
            time.sleep(0.3)


def screenshot(url: str, args: argparse.Namespace) -> None:
    """Translate ``args.line`` on the page at ``url`` and save the page to ``args.output``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1000,1100", "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    try:
        browser.get(url)
        WebDriverWait(browser, 30).until(lambda b: "→" in b.find_element(By.ID, "pair").text)
        browser.find_element(By.ID, "source").send_keys(args.line)
        for name, value in (("beam", args.beam), ("nbest", args.nbest)):
            field = browser.find_element(By.ID, name)
            field.clear()
            field.send_keys(str(value))
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, 60).until(
            lambda b: b.find_elements(By.CSS_SELECTOR, ".result canvas.heatmap")
        )
        time.sleep(0.5)  # the heatmap's paint
        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1000, height + 140)
        browser.save_screenshot(str(args.output))
        print(browser.find_element(By.CSS_SELECTOR, ".result .translation").text)
    finally:
        browser.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--line", required=True, help="the source sentence typed in the page")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--nbest", type=int, default=3)
    parser.add_argument("--output", type=Path, default=Path("docs/translation_page.png"))
    args = parser.parse_args()
    port = free_port()
    server = start_server(args.checkpoint, port)
    try:
        screenshot(f"http://127.0.0.1:{port}/", args)
    finally:
        server.terminate()
        server.communicate(timeout=30)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
