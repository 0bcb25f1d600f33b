"""The operations console in a real browser: Debian's chromium, headless, driven by Playwright
(the system's browser; Playwright downloads none). Overview (the last hour's dead letters by
reason) -> dead letters -> filter -> a record -> the cause's group -> dry run -> replay, then the
replayed copies counted on the broker.

REDRIVE_UPDATE_SCREENSHOT=1 also writes the dead-letter page's screenshot to docs/console.png,
the one the README shows."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright

from redrive.dev.ports import HOST, free_port
from redrive.ops.web import create_app

from ..consumer.conftest import read_all
from .conftest import topic_sizes
from .test_console import TOKEN, dead_letters  # noqa: F401 (a fixture)

DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is needed (make test installs it: apt-get install " \
                       "chromium)"
    with sync_playwright() as playwright:
        # As root (CI containers) chromium's sandbox cannot start.
        launched = playwright.chromium.launch(executable_path=executable, headless=True,
                                              args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def console_url(bootstrap: str) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(bootstrap, token=TOKEN, timeout_s=5.0),
                                           host=HOST, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the console did not start"
        time.sleep(0.05)
    yield f"http://{HOST}:{port}"
    server.should_exit = True
    thread.join(10)


def test_click_through_to_a_replay(browser: Browser, console_url: str, bootstrap: str,
                                   dead_letters: tuple[str, str, str]  # noqa: F811
                                   ) -> None:
    topic, group, dlt = dead_letters
    page: Page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(console_url)
    row = page.locator("#topics tr", has_text=dlt)
    expect(row).to_contain_text(group)
    expect(row.locator("td").nth(7)).to_have_text("6")
    expect(row.locator("td.dead-hour")).to_contain_text("exhausted 5, not-retryable 1")
    row.get_by_role("link").click()

    expect(page.locator("#total")).to_have_text("6")
    page.locator("#filter input[name=error_type]").fill("ValueError")
    page.locator("#filter button").click()
    expect(page.locator("#total")).to_have_text("1")
    page.locator("#records a").first.click()
    # The dead letter's value is markup: the page shows it as text and runs nothing.
    expect(page.locator("#value")).to_have_text("<script>alert(1)</script>")
    expect(page.locator("#story")).to_contain_text("not-retryable")
    expect(page.locator("#headers")).to_contain_text("redrive-original-topic")

    page.get_by_role("link", name=dlt).click()
    page.locator("#groups a", has_text="BadOrder").click()
    expect(page.locator("#total")).to_have_text("5")
    if os.environ.get("REDRIVE_UPDATE_SCREENSHOT"):
        page.screenshot(path=str(DOCS / "console.png"), full_page=True)
    before = topic_sizes(bootstrap, topic)[topic]

    page.locator("#replay input[name=token]").fill(TOKEN)
    page.locator("#dry-run").click()
    expect(page.locator("#planned")).to_have_text("5")
    assert topic_sizes(bootstrap, topic)[topic] == before  # a dry run publishes nothing

    page.go_back()
    page.locator("#replay input[name=token]").fill(TOKEN)
    page.locator("#replay-now").click()
    expect(page.locator("#replayed")).to_have_text("5")
    copies = read_all(bootstrap, topic, expect=before + 5, timeout_s=20)[before:]
    assert sorted(c.value for c in copies) == [b"bad-%d" % i for i in range(5)]
    page.close()
