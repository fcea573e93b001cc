"""The viewer over a data root as the demo leaves it (the demo config's bootstrap run, then its trained run): every
page the runs list leads to renders, each run says what it is and how it samples, and an iteration's trajectories
are in its first screen, where the filter returns."""

from __future__ import annotations

import html
import json
import re
from collections import Counter, deque
from urllib.parse import urljoin, urlsplit

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from ragen_core.storage import DataLake
from tests.view.conftest import DEMO_RUN, fetch
from tests.view.test_browser import follow, sql

SAME_KIND = 2  # pages crawled per route and set of query parameters (a trajectory page, a sorted iteration page...)


def links(page: str, body: str) -> list[str]:
    """The viewer's links of a page (``page``: its address), as addresses without their fragment."""
    found = [html.unescape(h) for h in re.findall(r'href="([^"]*)"', body)]
    joined = [urljoin(page, h).split("#")[0] for h in found if not h.startswith(("#", "http"))]
    return [link for link in joined if link and not link.startswith("/static/")]


def crawl(viewer, start: list[str]) -> dict[str, tuple[int, str]]:
    """Every page reachable from ``start`` by the viewer's links, :data:`SAME_KIND` of each kind, with its status
    and body."""
    opener, pages = viewer.opener(), {}
    kinds: Counter = Counter()
    queue = deque(start)
    while queue:
        link = queue.popleft()
        parts = urlsplit(link)
        kind = (parts.path, tuple(sorted({k for k, _ in re.findall(r"([^&=]+)=([^&]*)", parts.query)})))
        if link in pages or kinds[kind] >= SAME_KIND and link not in start:
            continue
        kinds[kind] += 1
        pages[link] = fetch(opener, viewer.base + link)
        queue.extend(links(link, pages[link][1]))
    return pages


def test_every_page_the_runs_list_leads_to_renders(demo_viewer, demo_root):
    runs = {r["run_id"]: r["kind"] for r in sql(demo_root, "SELECT run_id, kind FROM runs")}
    assert sorted(runs.values()) == ["bootstrap", "train"], "the premise: the demo's two runs"
    lake = DataLake(demo_root)
    iterations = [f"/runs/{r}/iterations/{i}" for r in sorted(runs) for i in lake.committed_iterations(r)]
    compare = "/compare?" + "&".join(f"run={r}" for r in sorted(runs))
    pages = crawl(demo_viewer, ["/", compare, *(f"/runs/{r}" for r in sorted(runs)), *iterations])
    failed = {link: status for link, (status, body) in pages.items() if status != 200 or 'id="error"' in body}
    assert not failed, failed
    kinds = {urlsplit(link).path.rsplit("/", 1)[-1] for link in pages}
    assert {"trajectory", "seed"} <= kinds, "the crawl reached the trajectories and the seed search"


def test_each_run_says_what_it_is_and_how_it_samples(demo_viewer, demo_root):
    runs = {r["run_id"]: r for r in sql(demo_root, "SELECT run_id, kind, config_json FROM runs")}
    bootstrap = next(r for r, row in runs.items() if row["kind"] == "bootstrap")
    opener = demo_viewer.opener()
    listed = fetch(opener, demo_viewer.base + "/")[1]
    rows = {r: re.search(rf'href="/runs/{r}">.*?</tr>', listed, re.S).group(0) for r in runs}
    assert 'bootstrap<br><span class="what">scripted demonstrations (SFT)</span>' in rows[bootstrap]
    config = json.loads(runs[DEMO_RUN]["config_json"])
    staleness, correction = config["trainer"]["max_staleness"], config["algorithm"]["off_policy_correction"]
    assert (staleness, correction) == (0, "none"), "the premise: the demo is synchronous, uncorrected"
    assert '<td class="schedule">synchronous, no off-policy correction</td>' in rows[DEMO_RUN]
    assert '<td class="schedule"></td>' in rows[bootstrap]
    page = fetch(opener, demo_viewer.base + f"/runs/{DEMO_RUN}")[1]
    assert f"<code>trainer.max_staleness={staleness}</code>" in page
    assert f"<code>algorithm.off_policy_correction={correction}</code>" in page
    demos = json.loads(runs[bootstrap]["config_json"])["bootstrap"]
    said = re.search(r'<dd id="kind">(.*?)</dd>', fetch(opener, demo_viewer.base + f"/runs/{bootstrap}")[1]).group(1)
    assert said == (
        f"bootstrap — scripted demonstrations (SFT): {demos['num_groups'] * demos['group_size']} demonstrations of "
        f"the scripted {demos['policy']} policy on bandit then {demos['epochs']} SFT epoch(s)"
    )


def test_an_iterations_trajectories_are_in_its_first_screen_and_the_filter_returns_there(
    browser, demo_viewer, demo_root
):
    groups = sql(
        demo_root,
        f"SELECT count(DISTINCT (split, env, group_id)) AS n FROM trajectories WHERE run_id = '{DEMO_RUN}' "
        "AND iteration = 0",
    )[0]["n"]
    assert groups > 100, "the premise: a groups table taller than the window"
    browser.get(demo_viewer.url)
    browser.get(demo_viewer.base + f"/runs/{DEMO_RUN}/iterations/0")
    height = browser.execute_script("return window.innerHeight")
    top = browser.execute_script("return document.getElementById('trajectories').getBoundingClientRect().top")
    assert 0 < top < height / 2, (top, height)
    assert browser.find_element(By.ID, "groups-list").get_attribute("open") is None, "the groups: one line, closed"
    Select(browser.find_element(By.NAME, "split")).select_by_value("val")
    follow(browser, By.ID, "apply")
    assert urlsplit(browser.current_url).fragment == "trajectories"
    assert "split=val" in urlsplit(browser.current_url).query
    top = browser.execute_script("return document.getElementById('trajectories').getBoundingClientRect().top")
    assert browser.execute_script("return window.scrollY") > 0 and abs(top) < 2, top
