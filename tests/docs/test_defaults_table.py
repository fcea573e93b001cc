"""docs/algorithms.md's table of defaults against RAGEN's: its "ours" column is what the config really defaults to."""

import re
from pathlib import Path

import yaml

from ragen_core.config import build_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"


def _rows() -> list[tuple[str, str, str, str]]:
    block = re.search(r"<!-- defaults:begin -->\n(.*?)<!-- defaults:end -->", DOC.read_text(), re.S)
    assert block, "docs/algorithms.md lost its table of defaults"
    rows = []
    for line in block.group(1).strip().splitlines()[2:]:  # after the header and its rule
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 4, line
        rows.append(tuple(cells))
    return rows


def _default(key: str, config: dict):
    value = config
    for part in key.split("."):
        value = value[part]
    return value


def test_every_documented_default_is_the_configs_default():
    config = build_config().to_dict()
    rows = _rows()
    assert len(rows) >= 30
    for key, ours, ragen, _why in rows:
        key, ours = key.strip("`"), ours.strip("`")
        assert _default(key, config) == yaml.safe_load(ours), (key, ours, _default(key, config))
        assert ragen, key


def test_a_default_that_differs_from_ragen_says_why():
    for key, ours, ragen, why in _rows():
        ragen_value = ragen.split(" ")[0].strip("`")
        try:
            same = yaml.safe_load(ours.strip("`")) == yaml.safe_load(ragen_value)
        except yaml.YAMLError:
            same = False
        if ragen.startswith("`") and not same:
            assert why, f"{key}: ours {ours} vs RAGEN {ragen} without a reason"
