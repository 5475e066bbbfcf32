"""The demo page and the API docs in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium) against ``spo serve`` on the demo model.

Skipped, saying why, when chromium or chromedriver is missing (``.ci/run`` installs both).
``BROWSER_SCREENSHOT=docs/demo-page.png`` also saves the page's screenshot there (the README's).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.settings import DEFAULT_MODEL_DIR
from tests.app.test_live import free_port, start_serve, stop, wait_ready

pytestmark = [pytest.mark.live, pytest.mark.browser, pytest.mark.timeout(300)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
TOKEN = "browser-token-0123456789"
MAX_TEXT_CHARS = 200
SENTENCE = "《霸王别姬》是陈凯歌执导的电影，张国荣、巩俐主演。"
WAIT_S = 60


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium and chromium-driver are not installed (.ci/run installs them)")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SPO_", "PROMETHEUS_"))},
        "SPO_MODEL_DIR": str(DEFAULT_MODEL_DIR),
        "SPO_WORKERS": "1",
        "SPO_AUTH_TOKENS": TOKEN,
        "SPO_MAX_TEXT_CHARS": str(MAX_TEXT_CHARS),
        "SPO_TIMEOUT": "120",
    }
    log = tmp_path_factory.mktemp("browser") / "gunicorn.log"
    process = start_serve(port, env, log)
    try:
        wait_ready(port, process, log, 120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


@pytest.fixture(scope="module")
def browser(base_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1000,1100", "--lang=zh-CN"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP violations are logged
    # Chromium's scratch folders (org.chromium.Chromium.*, left behind) go to the test's temporary
    # folder, which pytest removes, instead of /tmp.
    env = {**os.environ, "TMPDIR": str(tmp_path_factory.mktemp("chromium"))}
    service = Service(executable_path=CHROMEDRIVER, env=env)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: Any, css: str, visible: bool = True) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    condition = ec.visibility_of_element_located if visible else ec.presence_of_element_located
    return WebDriverWait(driver, WAIT_S).until(condition((By.CSS_SELECTOR, css)))


def set_text(driver: Any, text: str) -> None:
    driver.execute_script("document.getElementById('text').value = arguments[0];", text)


def test_browser_page_extracts_highlights_and_shows_problems(browser: Any, base_url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(base_url + "/")
    WebDriverWait(browser, WAIT_S).until(
        lambda d: "demo v1" in d.find_element(By.ID, "model-name").text
    )
    set_text(browser, SENTENCE)

    # Tokens are set on this server: the first try answers 401, shown, and opens the token field.
    browser.find_element(By.ID, "extract").click()
    error = wait_for(browser, "#error")
    assert "401" in error.text and "unauthorized" in error.text
    token = browser.find_element(By.ID, "token")
    assert token.is_displayed()
    token.send_keys(TOKEN)

    # Keyboard only: Ctrl+Enter in the text box extracts.
    browser.find_element(By.ID, "text").send_keys(Keys.CONTROL, Keys.ENTER)
    wait_for(browser, "#triples tr.triple")
    assert not browser.find_element(By.ID, "error").is_displayed()
    marks = browser.find_elements(By.CSS_SELECTOR, "#annotated mark")
    found = {(m.get_attribute("data-type"), m.text.split("\n")[0]) for m in marks}
    assert ("人物", "陈凯歌") in {(t, s.replace("人物", "")) for t, s in found}, found
    director = next(m for m in marks if m.text.startswith("陈凯歌"))
    assert director.get_attribute("title") == "人物 陈凯歌 [7, 10)"
    assert director.get_attribute("tabindex") == "0"
    rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#triples tr.triple")]
    assert any("霸王别姬" in r and "导演" in r and "陈凯歌" in r for r in rows), rows
    assert "request id" in browser.find_element(By.ID, "meta").text

    screenshot = os.environ.get("BROWSER_SCREENSHOT")
    if screenshot:
        browser.execute_script(
            "document.getElementById('token-box').open = false; document.activeElement.blur();"
        )
        browser.set_window_size(820, 1040)
        Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(screenshot)

    # A text over the limit: the problem is shown readably, the old result is hidden.
    set_text(browser, "长" * (MAX_TEXT_CHARS + 1))
    browser.find_element(By.ID, "extract").click()
    error = wait_for(browser, "#error")
    WebDriverWait(browser, WAIT_S).until(lambda d: "text_too_long" in error.text)
    assert f"{MAX_TEXT_CHARS + 1} characters; the limit is {MAX_TEXT_CHARS}" in error.text
    assert "request id" in error.text
    assert not browser.find_element(By.ID, "result").is_displayed()

    # Phone width: nothing wider than the screen.
    browser.set_window_size(375, 800)
    browser.find_element(By.CSS_SELECTOR, "#examples button").click()
    wait_for(browser, "#triples tr.triple")
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth;"
    )
    assert overflow <= 0
    browser.set_window_size(1000, 1100)


def test_browser_docs_show_the_extract_endpoint(browser: Any, base_url: str) -> None:
    browser.get(base_url + "/docs")
    endpoint = wait_for(browser, "[data-path='/v1/extract']")
    assert endpoint.text == "/v1/extract"
    assert browser.title == "spo-service API"
    # Every script and stylesheet came from the app itself.
    sources = browser.execute_script(
        "return [...document.querySelectorAll('script[src], link[href]')]"
        ".map(e => e.src || e.href);"
    )
    assert sources and all(s.startswith(base_url) for s in sources), sources
    # Nothing was blocked by the docs' Content-Security-Policy (its inline script allowed by hash).
    blocked = [
        e["message"] for e in browser.get_log("browser") if "Content Security" in e["message"]
    ]
    assert not blocked, blocked


# The page's fetch, slowed for texts that contain 慢: a stand-in for a long text's slow answer.
SLOW_FETCH = """
const original = window.fetch;
window.fetch = (url, options) => {
  const slow = options && options.body && JSON.parse(options.body).text.includes("慢");
  return slow
    ? new Promise((done) => setTimeout(done, 2500)).then(() => original(url, options))
    : original(url, options);
};
"""


def test_browser_a_slow_answer_never_overwrites_a_newer_one(browser: Any, base_url: str) -> None:
    """A slow answer that came back after a newer extraction replaced its result: the highlighted
    text and the triples of the old text stood under the new text in the box."""
    import time

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(base_url + "/")
    WebDriverWait(browser, WAIT_S).until(
        lambda d: "demo v1" in d.find_element(By.ID, "model-name").text
    )
    browser.execute_script(
        "document.getElementById('token').value = arguments[0];" + SLOW_FETCH, TOKEN
    )
    set_text(browser, "慢慢地，" + SENTENCE)
    browser.find_element(By.ID, "extract").click()
    example = browser.find_element(By.CSS_SELECTOR, "#examples button")
    example.click()  # while the slow one is on its way
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_element(By.ID, "annotated").text.replace("\n", "") != ""
    )
    time.sleep(4)  # the slow answer has come back by now
    shown = browser.execute_script(
        "const copy = document.getElementById('annotated').cloneNode(true);"
        "copy.querySelectorAll('.tag').forEach((t) => t.remove());"
        "return copy.textContent;"
    )
    assert shown == example.text, (shown, example.text)  # the text in the box, not the slow one's
    assert not browser.find_element(By.ID, "extract").get_attribute("disabled")
