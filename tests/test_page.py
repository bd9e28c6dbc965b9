"""The translation page at `/`, in a real headless Chromium (`make test-browser`).

Starts the server on 127.0.0.1 with the old fixture checkpoint, types the fixture's first
source line, clicks Translate and checks that the page shows what `mt translate` prints for the
same line and settings, the n-best list, and a drawn cross-attention heatmap of the right shape;
then that an error of the API (a 4xx) reaches the user, through Ctrl+Enter. Skips, saying why,
where no Chromium, chromedriver or selenium is installed. (The README's picture comes from a model
that translates: scripts/screenshot_page.py.)
"""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "old_checkpoint"
CHECKPOINT = FIXTURE / "old_last.pt"
BEAM = 3
NBEST = 3


def _browser() -> tuple[str, str]:
    """Paths of a Chromium and its chromedriver, or skip with what is missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed: pip install -e '.[browser]' (or make test-browser)")
    chrome = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )
    driver = shutil.which("chromedriver")
    if chrome is None or driver is None:
        missing = " and ".join(
            n for n, p in (("chromium", chrome), ("chromedriver", driver)) if not p
        )
        pytest.skip(f"no {missing} installed: apt-get install chromium chromium-driver")
    return chrome, driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def server_url():
    """`mt serve` on the fixture checkpoint, on a free port of 127.0.0.1."""
    pytest.importorskip("fastapi", reason="`mt serve` needs FastAPI: pip install -e '.[serve]'")
    pytest.importorskip("uvicorn", reason="`mt serve` needs uvicorn: pip install -e '.[serve]'")
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "transformer_mt", "serve", "--checkpoint", str(CHECKPOINT),
         "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    pytest.fail(f"`mt serve` did not start: {process.communicate()[1][-2000:]}")
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


@pytest.fixture
def browser():
    chrome, driver_path = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1000,1100", "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    yield driver
    driver.quit()


def _cli_nbest(line: str, tmp_path: Path) -> list[str]:
    """What `mt translate --beam BEAM --nbest NBEST` prints for ``line``: the n-best texts."""
    src = tmp_path / "line.txt"
    src.write_text(line + "\n", encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "transformer_mt", "translate", "--checkpoint", str(CHECKPOINT),
         "--input", str(src), "--beam", str(BEAM), "--nbest", str(NBEST)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return [row.split("\t")[0] for row in out.splitlines()]


def test_page_translates_and_draws_the_heatmap(browser, server_url, tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    line = (FIXTURE / "src.txt").read_text(encoding="utf-8").splitlines()[0]
    expected = _cli_nbest(line, tmp_path)
    wait = WebDriverWait(browser, 20, ignored_exceptions=[StaleElementReferenceException])

    browser.get(server_url + "/")
    pair = browser.find_element(By.ID, "pair")
    wait.until(lambda _: "→" in pair.text)
    with urllib.request.urlopen(server_url + "/v1/model", timeout=30) as response:
        languages = json.load(response)["languages"]  # the toy fixture's: src -> trg
    assert pair.text == f"{languages['source']} → {languages['target']}"

    source = browser.find_element(By.ID, "source")
    source.send_keys(line)
    for name, value in (("beam", BEAM), ("nbest", NBEST)):
        field = browser.find_element(By.ID, name)
        field.clear()
        field.send_keys(str(value))
    browser.find_element(By.ID, "translate").click()

    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".result .translation"))
    assert browser.find_element(By.CSS_SELECTOR, ".result .translation").text == expected[0]
    nbest = browser.find_elements(By.CSS_SELECTOR, ".result .nbest li span:first-child")
    assert [li.text for li in nbest] == expected
    assert not browser.find_element(By.ID, "error").is_displayed()

    # The heatmap has one row per target piece and one column per source piece of the API's
    # answer, and its cells are painted (many distinct colours, not a blank canvas).
    api = _post(server_url + "/v1/translate",
                {"text": [line], "beam": BEAM, "nbest": NBEST, "attention": True})  # fmt: skip
    attention = api["translations"][0]["attention"]
    canvas = browser.find_element(By.CSS_SELECTOR, ".result canvas.heatmap")
    rows, cols = int(canvas.get_attribute("data-rows")), int(canvas.get_attribute("data-cols"))
    assert (rows, cols) == (len(attention["target"]), len(attention["source"]))
    assert rows == len(attention["weights"]) and cols == len(attention["weights"][0])
    # Distinct saturated colours: the colour map's cells, not grey label text or background.
    colours = browser.execute_script(
        """const c = arguments[0], d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const seen = new Set();
        for (let i = 0; i < d.length; i += 4) {
          const [r, g, b, a] = [d[i], d[i + 1], d[i + 2], d[i + 3]];
          if (a === 255 && Math.max(r, g, b) - Math.min(r, g, b) > 40) seen.add((r << 16) | (g << 8) | b);
        }
        return seen.size;""",
        canvas,
    )
    assert colours > 20, f"the heatmap looks blank: {colours} colours"

    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"the page logged errors: {errors}"

    # Ctrl+Enter translates; the API's 4xx message is shown, not swallowed, and goes away with
    # the next translation (greedy: the fixture's expected.beam1.txt, which `mt translate` gives).
    beam = browser.find_element(By.ID, "beam")
    beam.clear()
    beam.send_keys("0")
    source.send_keys(Keys.CONTROL, Keys.ENTER)
    error = browser.find_element(By.ID, "error")
    wait.until(lambda _: error.is_displayed())
    assert "beam is 0" in error.text and "max_beam" in error.text, error.text  # the server's words

    beam.clear()
    beam.send_keys("1")
    source.send_keys(Keys.CONTROL, Keys.ENTER)
    greedy = (FIXTURE / "expected.beam1.txt").read_text(encoding="utf-8").splitlines()[0]
    translation = (By.CSS_SELECTOR, ".result .translation")
    wait.until(lambda b: b.find_element(*translation).text == greedy)
    assert not error.is_displayed()
    assert len(browser.find_elements(By.CSS_SELECTOR, ".result .nbest li")) == 1  # n-best <= beam
