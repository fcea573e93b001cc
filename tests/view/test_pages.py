"""The viewer's queries and pages without a browser: filters, sorting and paging against values computed in Python
from the planted rows; the advantage recomputed by hand; the grids and charts; the guard of a viewer bound beyond
loopback (its token) and of one on loopback (the Host it answers); bad addresses as one-line 400/404 pages."""

from __future__ import annotations

import html
import math
import re
import statistics
import time

import duckdb
import psutil
import pytest
from fastapi.testclient import TestClient

from ragen_core.storage import DataLake, QueryTimeout
from ragen_core.storage.statements import one_line
from ragen_view import describe, queries, render, sandbox, tokens
from ragen_view.app import create_app
from tests.storage.synthetic import write_run
from tests.view.conftest import PLANTED_RUN, SCRIPT_REPLY, planted_run


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    run = planted_run()
    lake = DataLake(tmp_path_factory.mktemp("planted"))
    write_run(lake, run)
    return lake, run


def _expected(run, iteration, keep=lambda t: True):
    return [t for t in run.trajectories if t.iteration == iteration and keep(t)]


def test_filters_sort_and_pages_match_the_rows_written(planted, monkeypatch):
    lake, run = planted
    monkeypatch.setattr(queries, "PAGE_SIZE", 5)
    rows = _expected(run, 0, lambda t: t.split == "train" and not t.success)
    page = queries.trajectories(lake, PLANTED_RUN, 0, queries.Filters(split="train", success=False), "reward", True)
    assert page.total == len(rows) and page.pages == math.ceil(len(rows) / 5)
    ordered = sorted(rows, key=lambda t: (-t.total_reward, t.split, t.env, t.group_id, t.traj_index))
    assert [(r["group_id"], r["traj_index"]) for r in page.rows] == [(t.group_id, t.traj_index) for t in ordered[:5]]
    last = queries.trajectories(
        lake, PLANTED_RUN, 0, queries.Filters(split="train", success=False), "reward", True, page=99
    )
    assert last.page == page.pages - 1 and len(last.rows) == len(rows) - 5 * (page.pages - 1)
    where = queries.Filters(where="num_turns >= 2 AND total_reward > -1 -- a comment eats its line only")
    wanted = _expected(run, 0, lambda t: len(t.turns) >= 2 and t.total_reward > -1)
    found = queries.trajectories(lake, PLANTED_RUN, 0, where)  # a SQL filter: paged in its own process, as here
    assert found.total == len(wanted) and len(found.rows) == min(5, len(wanted))
    assert found.pages == max(1, math.ceil(len(wanted) / 5))
    bounded = queries.Filters(min_reward=0.0, max_length=30)
    wanted = _expected(run, 0, lambda t: t.total_reward >= 0 and t.response_length <= 30)
    assert queries.trajectories(lake, PLANTED_RUN, 0, bounded).total == len(wanted)


def test_a_where_sees_its_partition_only_and_cannot_write(planted):
    import duckdb

    from ragen_core.storage import QueryRefused

    lake, run = planted
    assert queries.trajectories(lake, PLANTED_RUN, 0, queries.Filters(where="iteration <> 0")).total == 0
    assert queries.trajectories(lake, PLANTED_RUN, 1, queries.Filters()).total == len(_expected(run, 1))
    with pytest.raises(duckdb.CatalogException, match="metrics"):  # no other table has a view
        queries.trajectories(lake, PLANTED_RUN, 0, queries.Filters(where="(SELECT count(*) FROM metrics) > 0"))
    with pytest.raises(duckdb.PermissionException):  # no file but the partition's may be opened
        queries.trajectories(lake, PLANTED_RUN, 0, queries.Filters(where="EXISTS (FROM read_csv('/etc/hostname'))"))
    with pytest.raises(QueryRefused):
        queries.trajectories(lake, PLANTED_RUN, 0, queries.Filters(where="TRUE); DELETE FROM trajectories; SELECT (1"))


def test_groups_say_the_filters_choice_and_spread(planted):
    lake, run = planted
    found = {(g["split"], g["group_id"]): g for g in queries.groups(lake, PLANTED_RUN, 0)}
    for group_id in range(3):
        members = _expected(run, 0, lambda t, g=group_id: t.split == "train" and t.group_id == g)
        got = found[("train", group_id)]
        assert got["size"] == len(members) and got["kept"] is members[0].kept
        assert got["reward_std"] == pytest.approx(statistics.pstdev(t.total_reward for t in members))
        assert got["success"] == pytest.approx(sum(t.success for t in members) / len(members))


def test_the_advantage_is_grpos_over_the_group_computed_by_hand(planted):
    lake, run = planted
    config = {k: v for k, v in queries.run(lake, PLANTED_RUN)["config"].items() if k != "note"}  # a planted key
    with pytest.raises(tokens.AdvantageUnavailable, match="note: unknown key"):
        tokens.advantages(lake, PLANTED_RUN, 0, {**config, "note": "x"}, "train", (0, 0))
    for group_id in range(3):
        members = _expected(run, 0, lambda t, g=group_id: t.split == "train" and t.group_id == g)
        rewards = [t.total_reward for t in members]
        mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
        for t in members:
            values, note = tokens.advantages(lake, PLANTED_RUN, 0, config, "train", (group_id, t.traj_index))
            mask = t.row()["loss_mask"]
            expected = (t.total_reward - mean) / (std + 1e-6)
            assert note is None and len(values) == len(mask)
            for value, trained in zip(values, mask, strict=True):
                assert value == pytest.approx(expected if trained else 0.0, rel=1e-5, abs=1e-6)


def test_the_advantage_of_what_the_lake_cannot_recompute_says_why(planted):
    lake, _ = planted
    config = {"env": {"name": "bandit"}, "algorithm": {"adv_estimator": "gae"}}
    with pytest.raises(tokens.AdvantageUnavailable, match="critic"):
        tokens.advantages(lake, PLANTED_RUN, 0, config, "train", (0, 0))
    with pytest.raises(tokens.AdvantageUnavailable, match="a bootstrap run makes no StarPO update"):
        tokens.advantages(lake, PLANTED_RUN, 0, {}, "bootstrap", (0, 0))


def test_a_trajectory_is_cut_into_its_turns():
    row = {
        "input_ids": list(range(12)),
        "loss_mask": [0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0],
        "behavior_logprobs": [0.0] * 3 + [-0.5, -1.0] + [0.0] * 2 + [-0.1, -0.2, -0.3] + [0.0] * 2,
        "segment_lengths": None,
    }
    view = tokens.token_view(row, [{"turn_index": 0}, {"turn_index": 1}], None)
    assert [[t.position for t in turn.reply] for turn in view.turns] == [[3, 4], [7, 8, 9], []]
    assert [t.logprob for t in view.turns[1].reply] == [-0.1, -0.2, -0.3]
    assert view.turns[0].row == {"turn_index": 0} and not view.decoded
    windowed = {**row, "segment_lengths": [5, 7]}  # each turn its own window: the second starts at position 5
    view = tokens.token_view(windowed, [], None)
    assert [[t.position for t in turn.reply] for turn in view.turns] == [[3, 4], [7, 8, 9], []]
    # a window's tokens after its reply stay in that window (a turn of their own), never in the next one's context
    spill = {**row, "loss_mask": [0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0], "segment_lengths": [5, 7]}
    view = tokens.token_view(spill, [], None)
    assert [[t.position for t in turn.reply] for turn in view.turns] == [[3], [], [7, 8, 9], []]
    assert view.turns[2].context[0].text == "#5 #6 " and view.turns[1].context[0].text == "#4 "
    with pytest.raises(ValueError, match="loss_mask has 11 entries for its 12 token ids"):
        tokens.token_view({**row, "loss_mask": row["loss_mask"][:-1]}, [], None)
    with pytest.raises(ValueError, match="segment_lengths \\[5, 5\\] do not split"):
        tokens.token_view({**row, "segment_lengths": [5, 5]}, [], None)


def test_text_split_over_tokens_is_shown_whole(tiny_model_dir):
    tokenizer = tokens.tokenizer_of(str(tiny_model_dir))
    reply = tokenizer.encode("café 你好 🎉", add_special_tokens=False)
    context = tokenizer.encode("日本語の文", add_special_tokens=False)
    assert len(reply) > len("café 你好 🎉"), "the premise: some characters take several byte-level tokens"
    row = {"input_ids": context + reply, "loss_mask": [0] * len(context) + [1] * len(reply)}
    view = tokens.token_view(row, [], str(tiny_model_dir))
    assert view.decoded and view.turns[0].context[0].text == "日本語の文"
    pieces = [t.text for t in view.turns[0].reply]
    assert "".join(pieces) == "café 你好 🎉" and "\ufffd" not in "".join(pieces)
    assert tokens.Token("x", 1, 0, True, math.log(0.999)).level("logprob", 0) == 8
    assert tokens.Token("x", 1, 0, True, None, -2.0).level("advantage", 2.0) == 0
    assert tokens.Token("x", 1, 0, True, None, 0.0).level("advantage", 2.0) == 4


def test_grids_of_the_grid_envs_and_none_elsewhere():
    observation = "You are P.\nState:\n######\n#_P__#\n#_X__#\n#__O_#\n######\n10 actions left."
    sokoban = render.legend_of("sokoban")
    drawn = render.grid(sokoban, observation)
    names = [cell.tile.name for cell in drawn[1]]
    assert len(drawn) == 5 and names == ["wall", "floor", "player", "floor", "floor", "wall"]
    cell = render.grid(render.legend_of("frozen_lake"), "State:\n_G_O\n__O_\nO__P\nO_O_\nok")[2][3]
    assert (cell.symbol, cell.tile.name, cell.ink) == ("P", "player", "#ffffff")  # white on the player's blue
    assert render.legend_of("bandit") == () and render.grid((), observation) is None
    assert render.grid(sokoban, "no room here") is None
    assert render.legend_of("dataset") == ()  # an env that needs its options to be built draws no board
    assert (render.ink("#000000"), render.ink("#ffffff"), render.ink("#e0f2fe")) == ("#ffffff", "#111111", "#111111")


def test_a_chart_places_its_points_by_value():
    drawn = render.chart("t", "m", {"a": [(0, 0.0), (10, 1.0)], "b": [(5, 0.5)]}, {"a": 0, "b": 1})
    (x0, y0, _), (x1, y1, _) = drawn.lines[0].dots
    (xm, ym, tip) = drawn.lines[1].dots[0]
    assert x0 == render.LEFT and x1 == render.WIDTH - render.RIGHT and y0 == render.HEIGHT - render.BOTTOM
    assert (xm, ym) == ((x0 + x1) / 2, (y0 + y1) / 2) and tip == "b · iteration 5: 0.5"


def test_config_diff_names_the_keys_that_differ():
    assert queries.config_diff({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 4}) == [
        ("a.c", 2, 3),
        ("d", None, 4),
    ]


def test_pages_escape_the_lake_and_refuse_bad_addresses(planted):
    lake, _ = planted
    client = TestClient(create_app(lake.root), base_url="http://127.0.0.1")
    page = client.get(
        f"/runs/{PLANTED_RUN}/iterations/0/trajectory",
        params={"split": "train", "env": "bandit", "group": 0, "traj": 0},
    )
    assert page.status_code == 200 and SCRIPT_REPLY not in page.text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page.text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'none': no script at all
    for path, status, said in (
        ("/runs/nope", 404, "no run"),
        ("/runs/..%2F..", 404, ""),
        (f"/runs/{PLANTED_RUN}/iterations/7", 404, "no committed iteration 7"),
        (f"/runs/{PLANTED_RUN}/iterations/0?where=nonsense", 400, "the filter failed"),
        (f"/runs/{PLANTED_RUN}/iterations/0?sort=input_ids", 400, "unknown sort"),
        (f"/runs/{PLANTED_RUN}/iterations/0?success=maybe", 400, "yes, no or any"),
        (f"/runs/{PLANTED_RUN}/iterations/x", 400, "not one of the viewer"),
        ("/compare", 400, "pick one or more runs"),
    ):
        answer = client.get(path)
        assert answer.status_code == status and said in answer.text, (path, answer.status_code)
        assert "Traceback" not in answer.text
    assert client.post("/").status_code == 405


def test_on_loopback_only_loopback_hosts_are_served(planted):
    lake, _ = planted
    app = create_app(lake.root)
    for base in ("http://127.0.0.1:8765", "http://localhost", "http://LOCALHOST:80", "http://127.0.0.2:9"):
        assert TestClient(app, base_url=base).get("/").status_code == 200, base
    for header in ("[::1]", "[::1]:8765", "127.0.0.1"):
        assert TestClient(app, base_url="http://127.0.0.1").get("/", headers={"host": header}).status_code == 200
    for header in ("rebound.example", "rebound.example:8765", "127.0.0.1.rebound.example", "", "[::2]:80"):
        answer = TestClient(app, base_url="http://127.0.0.1").get("/", headers={"host": header})
        assert answer.status_code == 403, header


def test_a_damaged_commit_record_is_a_one_line_page_not_a_traceback(tmp_path):
    lake = DataLake(tmp_path)
    write_run(lake, planted_run())
    commit = lake.commit_marker(PLANTED_RUN, 0)
    (commit.parent / (commit.name + ".stray")).write_text("{}")
    (commit.parent / "iteration=0x.json").write_text("{}")
    client = TestClient(create_app(lake.root), base_url="http://127.0.0.1")
    for path in (f"/runs/{PLANTED_RUN}/iterations/0", f"/runs/{PLANTED_RUN}"):
        answer = client.get(path)
        assert answer.status_code in (200, 500) and "Traceback" not in answer.text, path
        if answer.status_code == 500:
            assert 'id="error"' in answer.text and answer.headers["content-security-policy"].startswith("default-src")


def test_beyond_loopback_every_request_needs_the_token(planted):
    lake, _ = planted
    client = TestClient(create_app(lake.root, token="s3cret", loopback=False), base_url="http://view.example")
    assert client.get("/").status_code == 403
    assert client.get("/?token=wrong").status_code == 403
    assert client.get("/?token=s3cr\u00e9t").status_code == 403  # not ASCII: refused, not a failure
    answer = client.get(f"/runs/{PLANTED_RUN}?token=s3cret", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == f"/runs/{PLANTED_RUN}"
    assert client.get(f"/runs/{PLANTED_RUN}").status_code == 200  # the cookie it set


def test_a_runs_events_are_listed_escaped(tmp_path):
    from ragen_core.storage.rows import event_row

    lake = DataLake(tmp_path)
    write_run(lake, planted_run())
    warning = event_row(
        PLANTED_RUN, 1, "early_warning", "<b>std</b> collapsed", "rollout/in_group_reward_std", 0.01, 0.05
    )
    lake.write_rows("events", PLANTED_RUN, 1, [warning], stage="events")
    page = TestClient(create_app(lake.root), base_url="http://127.0.0.1").get(f"/runs/{PLANTED_RUN}")
    assert page.status_code == 200 and 'id="events"' in page.text
    assert "&lt;b&gt;std&lt;/b&gt; collapsed" in page.text and "rollout/in_group_reward_std" in page.text


def test_a_filters_mistake_is_placed_in_its_own_text(planted):
    lake, _ = planted
    for where, line, spot, error in (
        ("num_turns > 'x'", 1, "'x'", duckdb.ConversionException),
        ("num_turns > 1\nAND AND total_reward > 0", 2, "AND total", duckdb.ParserException),
        ("num_turns > 1 AND " * 8 + "AND total_reward > 0", 1, "AND total", duckdb.ParserException),  # a long line
    ):
        column = where.splitlines()[line - 1].index(spot) + 1
        with pytest.raises(error) as raised:
            queries.trajectories(lake, PLANTED_RUN, 0, queries.Filters(where=where))
        assert one_line(str(raised.value)).endswith(f"(at line {line}, column {column} of the filter)"), raised.value
    with pytest.raises(duckdb.ParserException, match=r"^Parser Error: syntax error \(at the end of the filter\)$"):
        queries.trajectories(lake, PLANTED_RUN, 0, queries.Filters(where="num_turns = 1 AND ("))


def test_a_bad_filters_page_leads_back_to_the_iteration_without_it(planted):
    lake, _ = planted
    client = TestClient(create_app(lake.root), base_url="http://127.0.0.1")
    iteration = f"/runs/{PLANTED_RUN}/iterations/0"
    for query, back in (
        ("split=train&where=num_turns+%3E+%27x%27&page_no=2", "split=train"),
        ("success=maybe&kept=yes", "kept=yes"),
        ("sort=input_ids&desc=1&env=bandit", "env=bandit"),
    ):
        answer = client.get(f"{iteration}?{query}")
        assert answer.status_code == 400, query
        link = re.search(r'<a id="back" href="([^"]*)">back to iteration 0, without ', answer.text)
        assert link and html.unescape(link.group(1)) == f"{iteration}?{back}#trajectories", query


def test_on_loopback_too_every_request_needs_the_token(planted):
    lake, _ = planted
    client = TestClient(create_app(lake.root, token="s3cret", cookie="view_8765"), base_url="http://127.0.0.1:8765")
    refused = client.get(f"/runs/{PLANTED_RUN}")
    assert refused.status_code == 403 and "needs its access token" in refused.text
    assert "<code>ragen view</code> printed" in refused.text and str(lake.root) not in refused.text
    assert "not this viewer's" in client.get("/?token=s3cre").text
    answer = client.get(f"/runs/{PLANTED_RUN}?token=s3cret&metric=x", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == f"/runs/{PLANTED_RUN}?metric=x"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith("view_8765=s3cret;") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert client.get(f"/runs/{PLANTED_RUN}").status_code == 200  # the cookie it set
    assert TestClient(create_app(lake.root, token="s3cret"), base_url="http://x.example").get("/").status_code == 403


def test_a_runs_schedule_is_in_its_facts_and_in_the_runs_list(tmp_path):
    run = planted_run()
    run.config["trainer"] = {"max_staleness": 2}
    run.config["algorithm"]["off_policy_correction"] = "decoupled"
    lake = DataLake(tmp_path)
    write_run(lake, run)
    client = TestClient(create_app(lake.root), base_url="http://127.0.0.1")
    listed = client.get("/").text
    assert '<td class="schedule">asynchronous, staleness up to 2, decoupled off-policy correction</td>' in listed
    facts = client.get(f"/runs/{PLANTED_RUN}").text
    assert "<code>trainer.max_staleness=2</code>, <code>algorithm.off_policy_correction=decoupled</code>" in facts
    assert f'<dd id="kind">train — {describe.KINDS["train"]}</dd>' in facts


def test_a_filter_that_runs_too_long_is_stopped(planted, monkeypatch):
    lake, _ = planted
    monkeypatch.setattr(queries, "QUERY_TIMEOUT_S", 0.5)
    endless = queries.Filters(where="(SELECT sum(x) FROM range(1000000000000) t(x)) > 0")
    started = time.monotonic()
    with pytest.raises(QueryTimeout, match=r"^out of time \(a filter's query may run 0.5 s here\): narrow it$"):
        queries.trajectories(lake, PLANTED_RUN, 0, endless)
    assert time.monotonic() - started < sandbox.KILL_GRACE_S


def test_a_filters_process_that_does_not_stop_at_its_time_limit_ends_all_the_same():
    started = time.monotonic()
    with pytest.raises(QueryTimeout, match="out of time"):
        sandbox.run(sandbox.Limits(0.5, 10**9), time.sleep, 600)  # sleeps past any interrupt of DuckDB's
    assert sandbox.KILL_GRACE_S < time.monotonic() - started < sandbox.KILL_GRACE_S + 3
    server = psutil.Process(sandbox.SERVER.process.pid)
    while server.children() and time.monotonic() - started < sandbox.KILL_GRACE_S + 8:
        time.sleep(0.1)
    assert not server.children(), "the child ended at its alarm"


def test_a_filters_answer_is_rebuilt_from_plain_values_only():
    """The child's answer holds rows read from the data root: the viewer rebuilds lists, dicts, dates and the page,
    and refuses a pickle naming anything else (it would be called as the pickle says) without calling it."""
    import datetime
    import os
    import pickle

    from ragen_core.storage import QueryError
    from ragen_view.queries import Page
    from ragen_view.sandbox import plain_values

    page = Page([{"env": "bandit", "at": datetime.datetime(2026, 12, 6, 7, 0), "actions": [1, 2]}], 1, 0, 1)
    assert plain_values(pickle.dumps(("result", page))) == ("result", page)

    class Planted:
        def __reduce__(self):
            return (os.getpid, ())

    with pytest.raises(QueryError, match=r"may not hold posix\.getpid"):
        plain_values(pickle.dumps(("result", Planted())))


def test_filters_run_two_at_a_time_and_a_third_is_refused_in_one_line(planted, monkeypatch):
    """Each filter runs in a child whose memory may grow by 4 GB: eight at once took 6.3 GB of children (issue 66's
    re-probe). Two run at once; a third waits briefly for a place, then is refused, saying why; a place freed is
    taken again."""
    import threading

    from ragen_core.storage import QueryError
    from ragen_view import sandbox

    lake, run = planted
    monkeypatch.setattr(sandbox, "PLACE_WAIT_S", 0.2)
    where = queries.Filters(where="total_reward > -1")
    assert sandbox.MAX_RUNNING == 2
    held = [sandbox._PLACES.acquire(timeout=1) for _ in range(sandbox.MAX_RUNNING)]  # two filters running
    assert held == [True, True]
    try:
        started = time.monotonic()
        with pytest.raises(QueryError, match=r"^the viewer runs 2 filters at once \(each may use 4 GB\), and they"):
            queries.trajectories(lake, PLANTED_RUN, 0, where)
        assert time.monotonic() - started < 5
        threading.Timer(0.05, sandbox._PLACES.release).start()  # one ends while the next waits: it runs
        monkeypatch.setattr(sandbox, "PLACE_WAIT_S", 5.0)
        assert queries.trajectories(lake, PLANTED_RUN, 0, where).total == len(
            _expected(run, 0, lambda t: t.total_reward > -1)
        )
    finally:
        sandbox._PLACES.release()
