"""The trajectory page's "how it ended" section (issue 66): the trajectory's end reason and the env's state after its
last step, which no turn shows; a row stored before the lake kept them says so."""

from __future__ import annotations

import dataclasses
import html

from fastapi.testclient import TestClient

from ragen_core.storage import DataLake
from ragen_view.app import create_app
from tests.storage.synthetic import Trajectory, make_run, write_run

FINAL = "_X__\n_O_G"  # a FrozenLake-like state, the player in a hole


@dataclasses.dataclass
class Ended(Trajectory):
    """A synthetic trajectory that stores how it ended, as today's rollouts do."""

    def row(self) -> dict:
        return {**super().row(), "end_reason": "hole", "final_state": FINAL}


def _page(client: TestClient, run_id: str) -> str:
    answer = client.get(
        f"/runs/{run_id}/iterations/0/trajectory", params={"split": "train", "env": "bandit", "group": 0, "traj": 0}
    )
    assert answer.status_code == 200, answer.text[-2000:]
    return answer.text


def test_the_trajectory_page_shows_how_it_ended(tmp_path):
    lake = DataLake(tmp_path)
    ended = make_run(5, "ended", "bandit", iterations=1, groups=1, group_size=2)
    ended.trajectories = [
        Ended(**{f.name: getattr(t, f.name) for f in dataclasses.fields(t)}) for t in ended.trajectories
    ]
    write_run(lake, ended)
    write_run(lake, make_run(5, "older", "bandit", iterations=1, groups=1, group_size=2))  # rows without them
    client = TestClient(create_app(lake.root), base_url="http://127.0.0.1")
    page = _page(client, "ended")
    assert '<dd id="end-reason"><a href="#ending">hole</a></dd>' in page
    assert f'<pre id="final-state">{html.escape(FINAL)}</pre>' in page
    older = _page(client, "older")
    assert '<dd id="end-reason">—</dd>' in older and 'id="ending-missing"' in older and "final-state" not in older
