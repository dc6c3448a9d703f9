"""The chat page (GET /) in a real headless browser: Debian's chromium, driven by selenium through Debian's
chromedriver (scripts/setup.sh installs both where apt-get can run). It loads the page from the tiny test
server, sends a message with the server's API key, and checks the streamed answer, the colour of each
token's source, the live numbers and the verdict; then the switch that turns speculation off. A screenshot
of each answer is saved as a test artifact: under $SPECDEC_TEST_ARTIFACTS when set (CI uploads that folder),
else pytest's tmp dir (the path is printed either way).

Where chromium cannot be installed (no apt-get: not Debian) the test skips and says so, a machine skip
(tests/conftest.py MACHINE_SKIPS). Where apt-get is there but chromium is not, the skip says to run
scripts/setup.sh, and under CI=true it fails: there a missing browser is a missing install step.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from specdec.model.text_stream import TextStream

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--window-size=1280,860"]
MESSAGE = "Say hi"
N = 40


def _missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) or shutil.which(os.path.basename(path))):
            if shutil.which("apt-get") is None:
                return f"this machine has no apt-get, so Debian's chromium cannot be installed: {path} is missing"
            return (f"{path} is missing: run scripts/setup.sh (as root or with sudo) to install Debian's chromium "
                    "and chromium-driver")
    try:
        import selenium  # noqa: F401  (a test dependency: pyproject's [test] extra)
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver  # optional: only where a browser is
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or CHROMIUM
    for arg in ARGS:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts(tmp_path):
    folder = os.environ.get("SPECDEC_TEST_ARTIFACTS")
    if not folder:
        return tmp_path
    os.makedirs(folder, exist_ok=True)
    return Path(folder)


def wait_for(driver, condition, timeout: float = 90.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: condition(d))


def page_answer(driver) -> list[tuple[str, str]]:
    """(source, text) of each token piece of the last answer, as the page shows them."""
    return driver.execute_script(
        "const m = document.querySelectorAll('.msg.assistant');"
        "return Array.from(m[m.length - 1].querySelectorAll('.body .tok'))"
        ".map(s => [s.dataset.source, s.textContent]);")


def ask(driver, text: str) -> None:
    driver.find_element("id", "prompt").send_keys(text)
    driver.find_element("id", "send").click()
    wait_for(driver, lambda d: d.find_element("id", "status").text in ("done", "error"))
    assert driver.find_element("id", "status").text == "done", driver.find_element("id", "messages").text


def expected_characters(tokenizer, result) -> list[str]:
    stream = TextStream(tokenizer, (), skip_special=True, track_tokens=True)
    stream.finish(result.text, result.token_ids)
    return [result.source_names[result.sources[i]] for i, n in stream.pieces(0, len(result.text)) for _ in range(n)]


def test_the_page_streams_an_answer_and_colours_each_token_by_its_source(browser, tiny_server, tiny_reference,
                                                                          artifacts):
    driver = browser
    driver.get(tiny_server.base_url + "/")
    wait_for(driver, lambda d: d.find_element("id", "model").text == "tiny")  # /health needs no key
    driver.find_element("id", "api-key").send_keys(tiny_server.api_key)
    max_tokens = driver.find_element("id", "max-tokens")
    max_tokens.clear()
    max_tokens.send_keys(str(N))
    ask(driver, MESSAGE)
    shot = artifacts / "chat-page.png"
    driver.save_screenshot(str(shot))
    print(f"chat page screenshot: {shot}")

    expected = tiny_reference.generate(tiny_reference.chat_ids([{"role": "user", "content": MESSAGE}]), N,
                                       spec=tiny_server.engine.spec)
    pieces = page_answer(driver)
    assert "".join(text for _, text in pieces) == expected.text
    shown = [source for source, text in pieces for _ in text]  # per code point, as the page cuts the runs
    assert shown == expected_characters(tiny_reference.model.tokenizer, expected)
    colours = driver.execute_script(
        "return Array.from(document.querySelectorAll('.msg.assistant .tok')).map(s => "
        "[s.dataset.source, getComputedStyle(s).backgroundColor]);")
    drafted = {c for s, c in colours if s == "ngram-simple"}
    target = {c for s, c in colours if s == "target"}
    assert len(drafted) == 1 and drafted.isdisjoint(target)  # accepted drafts have their own colour
    legend = driver.execute_script("return Array.from(document.querySelectorAll('#legend div'))"
                                   ".map(d => d.dataset.source);")
    assert legend == ["target", "ngram-simple"]
    assert driver.find_element("id", "method").text == "ngram-simple"
    assert float(driver.find_element("id", "tps").text) > 0
    accepted, drafted_n = expected.stats.accepted, expected.stats.drafted
    assert driver.find_element("id", "acceptance").text == f"{accepted / drafted_n:.2f} ({accepted}/{drafted_n})"
    assert driver.find_element("id", "verdict").text.startswith("Verdict: ")
    assert "plain, estimated" in driver.find_element("id", "verdict").text
    cut = driver.execute_script("const m = document.querySelectorAll('.msg.assistant');"
                                "return Array.from(m[m.length - 1].querySelectorAll('.cut')).map(s => s.textContent);")
    assert expected.finish_reason == "length" and len(cut) == 1 and "token limit" in cut[0]  # max_tokens cut it

    # the switch: the same conversation goes on with speculation off, every token the target's
    driver.find_element("id", "spec-toggle").click()
    ask(driver, MESSAGE)
    driver.save_screenshot(str(artifacts / "chat-page-off.png"))
    assert {source for source, _ in page_answer(driver)} == {"target"}
    assert driver.find_element("id", "method").text == "none"
    assert "speculation was off for this request" in driver.find_element("id", "verdict").text


def test_the_page_cuts_runs_by_code_points(browser, tiny_server):
    # the server counts a run's characters in code points; a JS string's length counts UTF-16 units
    browser.get(tiny_server.base_url + "/")
    runs = browser.execute_script(
        "const d = document.createElement('div');"
        "appendPieces(d, 'a\\u{1F916}b\\u00e9', [['target', 1], ['suffix', 2], ['target', 1]]);"
        "return Array.from(d.querySelectorAll('.tok')).map(s => [s.dataset.source, s.textContent]);")
    assert runs == [["target", "a"], ["suffix", "\U0001F916b"], ["target", "\u00e9"]]


def test_a_blank_limit_asks_the_server_s_default_and_the_mark_follows_finish_reason(browser, tiny_server,
                                                                                    tiny_reference):
    driver = browser
    driver.get(tiny_server.base_url + "/")
    driver.find_element("id", "api-key").send_keys(tiny_server.api_key)
    driver.find_element("id", "max-tokens").clear()  # blank: the server's default, capped by the context
    message = "Say hi, then stop"
    ask(driver, message)
    expected = tiny_reference.generate(tiny_reference.chat_ids([{"role": "user", "content": message}]), 256,
                                       spec=tiny_server.engine.spec)
    assert "".join(text for _, text in page_answer(driver)) == expected.text
    cut = driver.execute_script("return document.querySelectorAll('.msg.assistant .cut').length;")
    assert cut == (1 if expected.finish_reason == "length" else 0)


def test_a_missing_browser_is_a_machine_skip_only_where_apt_get_cannot_install_it(monkeypatch, tmp_path):
    import sys

    module = sys.modules[__name__]
    monkeypatch.setattr(module, "CHROMIUM", str(tmp_path / "chromium"))  # not there
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "chromium" else real_which(name))
    with_apt = _missing()
    monkeypatch.setattr(shutil, "which", lambda name: None if name in ("chromium", "apt-get") else real_which(name))
    without_apt = _missing()
    assert without_apt.startswith("this machine has no apt-get")  # tests/conftest.py MACHINE_SKIPS: a machine skip
    assert with_apt.startswith(str(tmp_path / "chromium")) and "scripts/setup.sh" in with_apt  # a missing step
