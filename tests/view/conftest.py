"""The viewer's fixtures: a lake with a real run (the `train` flow on Sokoban with the tiny model) and planted runs
(hand-made rows, some holding HTML and script), a demo-like lake (the demo config's bootstrap run, then its trained
run), ``ragen view`` started as users start it, and a headless Chromium (Debian's, through its chromedriver: `make
install-browser`)."""

from __future__ import annotations

import hashlib
import http.cookiejar
import os
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from ragen_core.storage import DataLake
from tests.storage.synthetic import make_run, write_run

REAL_RUN = "soko-real"
DEMO_RUN = "demo"
PLANTED_RUN = "planted"
SCRIPT_REPLY = "<script>window.__pwned = 1</script><b>bold?</b>"
SCRIPT_CONFIG = '<img src=x onerror="window.__pwned = 2">'
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
REPO = Path(__file__).resolve().parents[2]


def real_config(model_dir: Path) -> dict:
    """A two-iteration Sokoban run of the tiny model: two turns, small groups, validated every iteration."""
    return {
        "model": {"path": str(model_dir)},
        "env": {
            "name": "sokoban",
            "val_envs": ["sokoban"],
            "max_turns": 2,
            "max_actions_per_turn": 1,
            "max_actions_per_traj": 2,
        },
        "rollout": {"env_groups": 2, "group_size": 2, "max_new_tokens": 8},
        "algorithm": {"preset": "starpo_s", "adv_estimator": "grpo"},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": 2},
        "eval": {"every": 1, "instances": 2},
    }


def demo_config(model_dir: Path) -> dict:
    """The demo's config (configs/bandit.yaml: a bootstrap on scripted demonstrations, then StarPO-S), smaller: one
    iteration, and 64 validation instances of each of its two validation envs (an iteration's groups: 130 rows)."""
    config = yaml.safe_load((REPO / "configs" / "bandit.yaml").read_text())
    config["model"] = {"path": str(model_dir)}
    config["rollout"].update(env_groups=2, group_size=4)
    config["actor"].update(mini_batch_size=8, micro_batch_size=8)
    config["trainer"]["iterations"] = 1
    config["eval"] = {"every": 1, "instances": 64}
    config["bootstrap"].update(num_groups=4, group_size=2, epochs=1)
    return config


def planted_run():
    """A hand-made Bandit run whose first reply holds HTML and script, whose config holds an HTML value, and whose
    advantages follow GRPO (the estimator named in its config)."""
    run = make_run(7, PLANTED_RUN, "bandit", iterations=2, groups=3, group_size=4)
    run.config["algorithm"] = {"preset": "starpo", "adv_estimator": "grpo", "filter_ratio": 1.0}
    run.config["note"] = SCRIPT_CONFIG
    first = next(t for t in run.trajectories if t.iteration == 0 and t.split == "train")
    first.turns[0].think = SCRIPT_REPLY
    return run


@pytest.fixture(scope="session")
def view_root(tmp_path_factory, tiny_model_dir, prefect_harness) -> Path:
    """The viewer tests' data root: the real run, then the planted one."""
    from flows.train import train

    root = tmp_path_factory.mktemp("view") / "lake"
    train(real_config(tiny_model_dir), data_root=str(root), run_id=REAL_RUN)
    write_run(DataLake(root), planted_run())
    return root


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory, tiny_model_dir, prefect_harness) -> Path:
    """A data root as the demo leaves it: the bootstrap run (demonstrations, no metrics) and the trained run."""
    from flows.train import train

    root = tmp_path_factory.mktemp("view-demo") / "lake"
    train(demo_config(tiny_model_dir), data_root=str(root), run_id=DEMO_RUN)
    return root


def tree_digest(root: Path) -> str:
    """A hash of every path, kind, size, mtime and content under ``root``: any write there changes it."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)}|{info.st_mode}|{info.st_size}|{info.st_mtime_ns}".encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


class Viewer:
    """A running ``ragen view`` process, the URL it printed (with its access token), the address without the token
    (``base``: ``http://host:port``) and the token."""

    def __init__(self, process: subprocess.Popen, url: str) -> None:
        self.process, self.url = process, url
        parts = urlsplit(url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.token = parse_qs(parts.query).get("token", [""])[0]

    def opener(self, visit: bool = True) -> urllib.request.OpenerDirector:
        """A client that keeps cookies as a browser does, having opened the printed URL (``visit``) as users do."""
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        if visit:
            with opener.open(self.url, timeout=120) as answer:
                answer.read()
        return opener

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def start_viewer(root: Path, *args: str) -> Viewer:
    """``ragen view --data-root ROOT --port 0 --no-open`` as users start it; its URL read from its output."""
    from ragen_view.server import spawn

    try:
        return Viewer(*spawn(root, *args, cwd=REPO))
    except RuntimeError as exc:
        raise AssertionError(str(exc)) from None


def fetch(opener: urllib.request.OpenerDirector, url: str, timeout: float = 120) -> tuple[int, str]:
    """The status and body of ``url`` (an error status too, as the page the viewer sent)."""
    try:
        with opener.open(url, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="session")
def demo_viewer(demo_root):
    """``ragen view`` of the demo-like root."""
    running = start_viewer(demo_root)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def viewer(view_root):
    """``ragen view`` of the viewer tests' root, with the root's digest taken before it started."""
    before = tree_digest(view_root)
    running = start_viewer(view_root)
    running.before = before
    yield running
    running.stop()


def browser_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            return f"{path} is not installed ('make install-browser' installs Debian's chromium and chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed ('make install' installs the dev extras)"
    return None


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium driven by chromedriver (skipped with the reason when not installed; RAGEN_REQUIRE_BROWSER=1,
    as CI sets it, makes that a failure)."""
    missing = browser_missing()
    if missing:
        if os.environ.get("RAGEN_REQUIRE_BROWSER") == "1":
            pytest.fail(f"RAGEN_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1300,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
