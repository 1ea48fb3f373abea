"""The playground (/ui) and /docs in a real headless Chromium (Debian's chromium + chromium-driver,
driven by Selenium) against a live server: the page loads, requests round-trip, heatmaps render.

Skips when Selenium or Chromium is missing (.ci/run installs both where apt is available).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
from support_serving import serve_in_thread

from service.settings import Settings

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (dev extra)")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402 - after the skip above
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="Chromium is not installed (apt-get install chromium chromium-driver)")


@pytest.fixture(scope="module")
def server(tiny_bundle):
    with serve_in_thread(Settings(bundle=tiny_bundle)) as base:
        yield base


def chromium_leftovers() -> set[Path]:
    """What Chromium writes to the system's temporary folder (and leaves there after it quits)."""
    return set(Path(tempfile.gettempdir()).glob("org.chromium.*"))


@pytest.fixture(scope="module")
def chromium_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("chromium")


def start_chromium(tmp: Path, *args: str):
    """A headless Chromium whose temporary files go under `tmp`: it leaves an empty folder in its
    TMPDIR on every run, which would pile up in the system's."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", *args):
        options.add_argument(arg)
    # An explicit driver path: Selenium Manager never tries to download one.
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER, env={**os.environ, "TMPDIR": str(tmp)})
    return webdriver.Chrome(options=options, service=service)


@pytest.fixture(scope="module")
def browser(chromium_tmp):
    driver = start_chromium(chromium_tmp, "--window-size=1400,1800")
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def finished(browser, timeout: float = 60) -> None:
    """Wait for the page's run to end, and require success."""
    WebDriverWait(browser, timeout).until(
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in ("done", "error"))
    body = browser.find_element(By.TAG_NAME, "body")
    assert body.get_attribute("data-state") == "done", browser.find_element(By.ID, "status").text


def cells(browser, plot: str) -> list:
    return browser.find_elements(By.CSS_SELECTOR, f"#{plot} svg rect.cell")


def typed_lines(browser) -> list[str]:
    typed = browser.find_element(By.ID, "sentences").get_attribute("value")
    return [t.strip() for t in typed.split("\n") if t.strip()]


def test_playground_round_trips_and_draws_heatmaps(server, browser, tmp_path: Path):
    browser.get(f"{server}/")  # redirects to /ui/, which analyses its example sentences at once
    try:
        finished(browser)
        assert browser.current_url == f"{server}/ui/"
        texts = typed_lines(browser)
        n = len(texts)
        # the similarity cells hold what the API answers for the same sentences
        matrix = httpx.post(f"{server}/similarity", json={"texts": texts, "truncate": True}).json()["matrix"]
        shown = [float(c.get_attribute("data-value")) for c in cells(browser, "similarity")]
        assert shown == pytest.approx([v for row in matrix for v in row], abs=1e-5)
        assert len(cells(browser, "nli")) == n * (n - 1)
        assert len(browser.find_elements(By.CSS_SELECTOR, "#sentiment tbody tr")) == n
        # heatmaps of the first sentence: token weights + gates, forward and backward attention
        tokens = httpx.post(f"{server}/tokenize", json={"texts": texts[:1]}).json()["results"][0]["count"]
        assert len(cells(browser, "token-weights")) == 3 * tokens
        for plot in ("attention-fw", "attention-bw", "token-weights", "similarity"):
            fills = {c.get_attribute("fill") for c in cells(browser, plot)}
            assert len(fills) > 2, (plot, fills)  # a real gradient, not one flat colour

        # type new sentences and run again: a fresh round trip drawn from the new answer
        box = browser.find_element(By.ID, "sentences")
        box.clear()
        box.send_keys("the movie was great\nthe movie was not good at all")
        browser.find_element(By.ID, "run").click()
        WebDriverWait(browser, 60).until(lambda d: len(cells(d, "similarity")) == 4)
        finished(browser)
        assert len(cells(browser, "attention-fw")) == 4 * 4  # "the movie was great"
        # picking the second sentence redraws the attention for its 7 tokens
        browser.find_element(By.CSS_SELECTOR, "#explain-pick option[value='1']").click()
        WebDriverWait(browser, 10).until(lambda d: len(cells(d, "attention-bw")) == 7 * 7)
    except Exception:
        browser.save_screenshot(str(tmp_path / "playground.png"))  # look at it when this fails
        raise


def ranked_on_page(browser, timeout: float = 30) -> WebDriverWait:
    """A wait on the search results: the page redraws the list while a wait reads it, and an item
    read as it is replaced is stale, not an answer (read again on the next poll)."""
    return WebDriverWait(browser, timeout, ignored_exceptions=(StaleElementReferenceException,))


def results(browser) -> list[tuple[int, float]]:
    return [(int(li.get_attribute("data-index")), float(li.get_attribute("data-score")))
            for li in browser.find_elements(By.CSS_SELECTOR, "#search-results li")]


def ranked(answer: list[dict]) -> list[tuple[int, float]]:
    return [(r["index"], pytest.approx(r["score"], abs=1e-5)) for r in answer]


def rerank(base: str, query: str, texts: list[str], **extra) -> list[dict]:
    body = {"query": query, "texts": texts, "truncate": True, **extra}
    return httpx.post(f"{base}/rerank", json=body).json()


def search_typed(browser, lines: list[str], query: str) -> None:
    """Type `lines` into the sentences box and `query` into the search field, then Enter (a search)."""
    box = browser.find_element(By.ID, "sentences")
    box.clear()
    box.send_keys("\n".join(lines))
    field = browser.find_element(By.ID, "query")
    field.clear()
    field.send_keys(f"{query}\n")


def test_search_ranks_the_sentences_as_rerank_does(server, browser, tmp_path: Path):
    browser.get(f"{server}/ui/")
    try:
        finished(browser)
        query = browser.find_element(By.ID, "query").get_attribute("value")
        assert results(browser) == ranked(rerank(server, query, typed_lines(browser)))
        # this bundle has no lexical table: no hybrid control, so no request it would refuse (424)
        assert not browser.find_element(By.ID, "hybrid-control").is_displayed()

        # more lines than the heatmaps show are all ranked; a new query runs on Enter
        many = [f"sentence number {i} about a {'dog' if i % 3 else 'guitar'}" for i in range(12)]
        search_typed(browser, many, "a guitar")
        ranked_on_page(browser).until(lambda d: len(results(d)) == 12)
        assert results(browser) == ranked(rerank(server, "a guitar", many))
    except Exception:
        browser.save_screenshot(str(tmp_path / "search.png"))
        raise


def test_search_sends_the_hybrid_weight_where_the_bundle_has_a_lexical_table(sparse_bundle, browser,
                                                                              tmp_path: Path):
    with serve_in_thread(Settings(bundle=sparse_bundle)) as base:
        browser.get(f"{base}/ui/")
        try:
            finished(browser)
            assert browser.find_element(By.ID, "hybrid-control").is_displayed()
            texts = typed_lines(browser)
            query = browser.find_element(By.ID, "query").get_attribute("value")
            browser.execute_script("const r = document.getElementById('hybrid'); r.value = '0.5';"
                                   "r.dispatchEvent(new Event('input'));"
                                   "r.dispatchEvent(new Event('change'));")
            want, dense = rerank(base, query, texts, hybrid=0.5), rerank(base, query, texts)
            assert ranked(want) != ranked(dense)  # the weight changes the scores, so the check can fail
            ranked_on_page(browser).until(lambda d: results(d) == ranked(want))
            assert browser.find_element(By.ID, "hybrid-value").text == "0.5"
        except Exception:
            browser.save_screenshot(str(tmp_path / "hybrid.png"))
            raise


def test_the_page_keeps_to_the_servers_limit_on_texts_a_request(tiny_bundle, browser, tmp_path: Path):
    """A server that takes 6 texts a request (max_texts_per_request): the page analyses the first 3
    sentences (NLI sends their 6 ordered pairs) and ranks the first 6 lines, and says so, where it
    used to send 12 pairs and show the server's 413."""
    with serve_in_thread(Settings(bundle=tiny_bundle, max_texts_per_request=6)) as base:
        browser.get(f"{base}/ui/")
        try:
            finished(browser)  # the 4 example sentences: 12 ordered pairs for NLI, over the limit
            assert len(cells(browser, "similarity")) == 3 * 3 and len(cells(browser, "nli")) == 3 * 2
            many = [f"line {i} is about a {'cat' if i % 2 else 'violin'}" for i in range(10)]
            search_typed(browser, many, "a violin")
            want = ranked(rerank(base, "a violin", many[:6]))
            ranked_on_page(browser).until(lambda d: results(d) == want)
            status = browser.find_element(By.ID, "status").text
            assert "6 texts a request" in status and "first 6 lines" in status, status
        except Exception:
            browser.save_screenshot(str(tmp_path / "limit.png"))
            raise


def test_docs_render_offline_in_a_browser(server, browser):
    """Swagger UI builds the operation list from the local assets (this machine has no CDN)."""
    browser.get(f"{server}/docs")
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock"))
    summaries = {e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    paths = {s.replace("\u200b", "") for s in summaries}  # Swagger UI puts zero-width spaces in paths
    assert {"/embed", "/similarity", "/tokenize", "/v1/models"} <= paths


def test_chromium_writes_its_temporary_files_under_pytest_not_the_system_temp(chromium_tmp):
    before = chromium_leftovers()
    own = chromium_tmp / "own"
    own.mkdir()
    driver = start_chromium(own)
    try:
        driver.get("data:text/html,<p>hello</p>")
    finally:
        driver.quit()
    assert chromium_leftovers() == before
    assert any(p.name.startswith("org.chromium.") for p in own.iterdir())


def test_sentences_past_the_servers_explain_tokens_still_get_labels(tiny_bundle, browser, tmp_path: Path):
    """A server that explains at most 8 tokens a request (max_explain_tokens): the example
    sentences hold more, so the sentiment call with explain=true is a 413. The page shows the
    labels without the heatmaps and says why, where it used to end on the server's error."""
    with serve_in_thread(Settings(bundle=tiny_bundle, max_explain_tokens=8)) as base:
        browser.get(f"{base}/ui/")
        try:
            finished(browser)
            texts = typed_lines(browser)
            assert len(browser.find_elements(By.CSS_SELECTOR, "#sentiment tbody tr")) == len(texts)
            assert not browser.find_element(By.ID, "explain").is_displayed()
            status = browser.find_element(By.ID, "status").text
            assert "explain" in status and "8 tokens" in status, status
        except Exception:
            browser.save_screenshot(str(tmp_path / "explain-limit.png"))
            raise
