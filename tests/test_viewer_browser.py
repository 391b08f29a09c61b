"""The viewer as a person uses it: a real headless Chromium opens the live app and the report,
sees the charts drawn, opens a step and an episode.

Needs Debian's ``chromium`` and ``chromium-driver`` (``make browser``, run by ``make test``,
installs them when it can) and ``selenium`` (the ``dev`` extra); skips saying which is missing.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the viewer's charts need matplotlib (the `view` extra)")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    pytest.skip(
        "no headless browser: Debian's chromium and chromium-driver are not installed "
        "(`make browser` installs them as root; it printed why it could not)",
        allow_module_level=True,
    )

REPO = Path(__file__).resolve().parents[1]


def _write_run(path: Path) -> Path:
    spec = importlib.util.spec_from_file_location("synthetic_run", REPO / "bench" / "synthetic_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_run(path, steps=4, tasks=2, group_size=3, calls=2, eval_every=2, eval_episodes=2)


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    import uvicorn

    from agentgym_lightning.viewer.app import make_app
    from agentgym_lightning.viewer.run import RunFolder

    run = _write_run(tmp_path_factory.mktemp("runs") / "run")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(make_app([RunFolder(run)], refresh_ms=300), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", run
    server.should_exit = True
    thread.join(timeout=10)


def _charts_drawn(driver) -> list[str]:
    """The titles of the charts the browser laid out with a real size and drawn lines."""
    drawn = []
    for chart in driver.find_elements(By.CSS_SELECTOR, ".chart svg"):
        size = chart.size
        lines = chart.find_elements(By.CSS_SELECTOR, "path")
        if size["width"] > 200 and size["height"] > 100 and len(lines) > 5:
            drawn.append(chart.find_element(By.CSS_SELECTOR, "text").get_attribute("textContent"))
    return drawn


def test_the_live_app_draws_charts_and_opens_an_episode(browser, live):
    url, run = live
    browser.get(url)
    # The live page reloads itself when the run's version changes (polled every 300 ms here): on a
    # loaded machine a reload can be under way while the charts are read; read them once it is done.
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + 20
    while True:
        try:
            drawn = _charts_drawn(browser)
        except StaleElementReferenceException:  # the page was replaced while being read
            drawn = []
        if len(drawn) >= 8 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(drawn) >= 8, drawn
    assert browser.find_elements(By.CSS_SELECTOR, ".alarm")
    browser.find_element(By.LINK_TEXT, "step 4").click()
    assert "episodes of step 4" in browser.title
    browser.find_element(By.LINK_TEXT, "s4-t0-m0").click()
    calls = browser.find_elements(By.CSS_SELECTOR, ".call")
    assert len(calls) == 3 and calls[0].is_displayed()  # 2 calls and the end
    assert "call 0" in calls[0].text and "advantage" in calls[0].text
    # the page refreshes by itself when the run writes to the file it shows
    marker = browser.execute_script("window.__before = 1; return window.__before")
    assert marker == 1
    from agentgym_lightning import Trajectory, TrajectoryWriter

    with TrajectoryWriter(run / "trajectories" / "step-000004.jsonl", append=True) as writer:
        writer.write(Trajectory(episode_id="late", group_id="s4-t0"))
    deadline = time.monotonic() + 20
    while browser.execute_script("return window.__before") == 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert browser.execute_script("return window.__before") is None, "the page did not reload after the run wrote"


def test_the_report_file_draws_charts_and_opens_an_episode(browser, tmp_path):
    from agentgym_lightning.viewer import write_report

    run = _write_run(tmp_path / "run")
    out = tmp_path / "report.html"
    write_report([str(run)], str(out))
    browser.get(out.as_uri())
    assert len(_charts_drawn(browser)) >= 8
    episode = browser.find_element(By.ID, "r0-train-4-s4-t1-m2")
    assert not episode.find_element(By.CSS_SELECTOR, ".call").is_displayed()  # closed until asked for
    browser.find_element(By.LINK_TEXT, "s4-t1-m2").click()
    # the click opens it from a script: wait for it (a loaded machine once failed the bare check)
    WebDriverWait(browser, 10).until(lambda _: episode.find_element(By.CSS_SELECTOR, ".call").is_displayed())
    assert "call 1" in episode.text
