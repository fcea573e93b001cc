"""The viewer in a real headless browser, against `ragen view` started as users start it: runs -> a run's curves ->
an iteration -> a failed trajectory with its coloured tokens, each value on the page checked against `ragen sql` of
the same rows; a planted reply holding <script> shown as text; the data root unchanged by all of it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from urllib.parse import urlsplit

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.view.conftest import (
    PLANTED_RUN,
    REAL_RUN,
    REPO,
    SCRIPT_CONFIG,
    SCRIPT_REPLY,
    start_viewer,
    tree_digest,
)


def sql(root, statement: str) -> list[dict]:
    """Rows of `ragen sql` (the command itself, as JSON)."""
    done = subprocess.run(
        [sys.executable, "-m", "ragen_cli.main", "sql", statement, "--data-root", str(root), "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def texts(browser, selector: str) -> list[str]:
    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, selector)]


def follow(browser, by: str, value: str) -> None:
    """Click what leads to another page, then wait until that page has replaced this one and finished loading.

    Chromedriver may return from a click on a form's submit button before the navigation begins, so a lookup right
    after it can find the old page's element, which goes stale under it (CI saw that once)."""
    old = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(by, value).click()
    wait = WebDriverWait(browser, 60)
    wait.until(expected_conditions.staleness_of(old))
    wait.until(lambda b: b.execute_script("return document.readyState") == "complete")


def test_runs_to_a_failed_trajectory_with_its_coloured_tokens(browser, viewer, view_root):
    browser.get(viewer.url)
    assert REAL_RUN in texts(browser, "a.run-link") and PLANTED_RUN in texts(browser, "a.run-link")
    follow(browser, By.LINK_TEXT, REAL_RUN)

    # the run's curves: the validation success chart holds one point per validated iteration, with its value
    assert browser.find_element(By.ID, "run-id").text == REAL_RUN
    chart = browser.find_element(By.CSS_SELECTOR, 'figure[data-metric="val/sokoban/success"]')
    tips = [t.get_attribute("textContent") for t in chart.find_elements(By.CSS_SELECTOR, "circle title")]
    expected = sql(
        view_root,
        f"SELECT iteration, value FROM metrics WHERE run_id = '{REAL_RUN}' "
        "AND name = 'val/sokoban/success' ORDER BY iteration",
    )
    assert tips == [f"{REAL_RUN} · iteration {r['iteration']}: {r['value']:.4g}" for r in expected]
    assert browser.find_elements(By.CSS_SELECTOR, 'figure[data-metric="actor/entropy"] polyline')

    # an iteration: the count under its filters equals SQL's
    follow(browser, By.CSS_SELECTOR, "a.iteration-link[href$='/iterations/1']")
    count = sql(view_root, f"SELECT count(*) AS n FROM trajectories WHERE run_id = '{REAL_RUN}' AND iteration = 1")
    assert browser.find_element(By.ID, "count").text.startswith(f"{count[0]['n']} trajectories")
    Select(browser.find_element(By.NAME, "success")).select_by_value("no")
    Select(browser.find_element(By.NAME, "split")).select_by_value("train")
    follow(browser, By.ID, "apply")
    failed = sql(
        view_root,
        f"SELECT group_id, traj_index, total_reward FROM trajectories WHERE run_id = "
        f"'{REAL_RUN}' AND iteration = 1 AND split = 'train' AND NOT success "
        "ORDER BY group_id, traj_index",
    )
    assert failed, "the premise: the tiny model fails some training rollouts"
    assert browser.find_element(By.ID, "count").text.startswith(f"{len(failed)} trajectories")
    assert texts(browser, "a.trajectory-link") == [f"{r['group_id']}/{r['traj_index']}" for r in failed]

    # a failed trajectory: its rewards, and one coloured span per trained token
    first = failed[0]
    follow(browser, By.CSS_SELECTOR, "a.trajectory-link")
    assert browser.find_element(By.ID, "outcome").text == "failure"
    assert float(browser.find_element(By.ID, "total-reward").text) == float(f"{first['total_reward']:.6g}")
    row = sql(
        view_root,
        f"SELECT loss_mask, behavior_logprobs, segment_lengths FROM trajectories WHERE run_id = "
        f"'{REAL_RUN}' AND iteration = 1 AND split = 'train' AND group_id = {first['group_id']} "
        f"AND traj_index = {first['traj_index']}",
    )[0]
    trained = [p for p, m in enumerate(row["loss_mask"]) if m == 1]
    assert len(browser.find_elements(By.CSS_SELECTOR, "p.tokens span.tok.trained")) == len(trained)
    assert browser.find_elements(By.CSS_SELECTOR, "table.grid td.tile.player"), "the Sokoban room is drawn"
    # in the env's own colours (its grid_legend), which the pages' CSP lets through as SVG fills (no inline style)
    wall = browser.find_element(By.CSS_SELECTOR, "table.grid td.tile.wall rect")
    assert wall.value_of_css_property("fill") == "rgb(87, 83, 78)"  # Sokoban's wall tile, #57534e

    # the sampler log-prob colouring: each token's bucket and tooltip from its stored log-prob
    follow(browser, By.LINK_TEXT, "sampler log-prob")
    spans = browser.find_elements(By.CSS_SELECTOR, "p.tokens span.tok")
    assert len(spans) == len(trained)
    for span, position in zip(spans, trained, strict=True):
        logprob = row["behavior_logprobs"][position]
        bucket = min(8, int(math.exp(logprob) * 9))
        assert f"lp-{bucket}" in span.get_attribute("class").split()
        assert f"#{position} " in span.get_attribute("title")
        assert f"log-prob {logprob:.4g}" in span.get_attribute("title")

    # the advantage colouring: a token of each reply carries the update's advantage (GRPO over its group)
    follow(browser, By.LINK_TEXT, "advantage")
    spans = browser.find_elements(By.CSS_SELECTOR, "p.tokens span.tok")
    assert len(spans) == len(trained)
    group = sql(
        view_root,
        f"SELECT traj_index, total_reward, kept FROM trajectories WHERE run_id = '{REAL_RUN}' "
        f"AND iteration = 1 AND split = 'train' AND group_id = {first['group_id']} "
        "ORDER BY traj_index",
    )
    if group[0]["kept"]:
        rewards = [r["total_reward"] for r in group]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        advantage = (first["total_reward"] - mean) / (std + 1e-6)
        assert all(f"advantage {advantage:.4g}" in s.get_attribute("title") for s in spans)
    else:
        assert "dropped" in browser.find_element(By.ID, "advantage-missing").text


def visit(browser, viewer, path: str) -> None:
    """Open the viewer's page ``path`` as a user does: the printed URL first (its token leaves a cookie), then the
    page."""
    browser.get(viewer.url)
    browser.get(viewer.base + path)


def test_a_planted_script_is_shown_as_text_and_never_runs(browser, viewer):
    visit(browser, viewer, f"/runs/{PLANTED_RUN}/iterations/0")
    Select(browser.find_element(By.NAME, "split")).select_by_value("train")
    follow(browser, By.ID, "apply")
    follow(browser, By.CSS_SELECTOR, "a.trajectory-link")
    assert SCRIPT_REPLY in texts(browser, "dd.think")
    assert browser.execute_script("return window.__pwned === undefined")
    browser.get(viewer.base + f"/runs/{PLANTED_RUN}")
    browser.find_element(By.CSS_SELECTOR, "details summary").click()
    assert any(SCRIPT_CONFIG in t for t in texts(browser, "table.config td"))
    assert browser.execute_script("return window.__pwned === undefined")
    assert not browser.find_elements(By.CSS_SELECTOR, "main script, main img")


def test_the_viewer_writes_nothing(browser, viewer, view_root):
    """Every page above, then the root's tree hashed again (runs in this module's order: last)."""
    trajectory = f"/runs/{REAL_RUN}/iterations/0/trajectory?split=val&env=sokoban&group=0&traj=0&colour=advantage"
    browser.get(viewer.url)
    for path in ("/", f"/runs/{REAL_RUN}", f"/compare?run={REAL_RUN}&run={PLANTED_RUN}", trajectory):
        browser.get(viewer.base + path)
        assert not browser.find_elements(By.ID, "error"), (path, browser.page_source[-2000:])
    assert tree_digest(view_root) == viewer.before


def test_the_token_is_asked_for_once_then_kept_in_a_cookie(browser, view_root):
    """Another user of the machine can reach a loopback port: the printed URL holds a token made at this start, a
    request without it is a 403 that says how to get in, and the first visit with it leaves an HttpOnly,
    SameSite=Strict cookie by which the links work."""
    viewer = start_viewer(view_root)
    try:
        assert len(viewer.token) >= 24, viewer.url
        browser.get(viewer.base + f"/runs/{REAL_RUN}")
        assert browser.find_element(By.ID, "forbidden").text == "This viewer needs its access token"
        said = browser.find_element(By.TAG_NAME, "body").text
        assert "the URL that ragen view printed when it started" in said and "?token=" in said
        assert str(view_root) not in browser.page_source and REAL_RUN not in browser.page_source
        browser.get(viewer.base + f"/runs/{REAL_RUN}?token=not-this-one")
        assert "not this viewer's" in browser.find_element(By.ID, "forbidden").text
        browser.get(viewer.url)
        assert browser.current_url == viewer.base + "/", "the token leaves the address once the cookie holds it"
        cookie = browser.get_cookie(f"ragen_view_token_{urlsplit(viewer.url).port}")
        assert cookie["value"] == viewer.token and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        follow(browser, By.LINK_TEXT, REAL_RUN)
        assert browser.find_element(By.ID, "run-id").text == REAL_RUN
    finally:
        viewer.stop()
