"""What a flow run's parameters look like on the Prefect server: JSON parameters as Prefect's own conversion writes
them (texts escaped), without importing FastAPI for it; any other value still goes through Prefect's conversion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.encoders import jsonable_encoder

from flows.ui import ShownFlow


def _flow() -> ShownFlow:
    def work(**kwargs):
        return kwargs

    return ShownFlow(work, name="parameters-probe")


def test_json_parameters_are_stored_as_prefects_conversion_stores_them():
    parameters = {"seed": 3, "rate": 0.5, "on": True, "none": None, "overrides": ["a=1", "b=x"], "nested": {"k": [1]}}
    assert _flow().serialize_parameters(parameters) == jsonable_encoder(parameters)


def test_other_values_still_go_through_prefects_conversion_and_texts_are_escaped():
    parameters = {"root": Path("/tmp/x"), "pair": (1, 2), "text": "a\x1b[31mb"}
    stored = _flow().serialize_parameters(parameters)
    assert stored == {"root": "/tmp/x", "pair": [1, 2], "text": "a\\x1b[31mb"}


@pytest.mark.process  # a fresh process
def test_a_flows_json_parameters_import_no_fastapi():
    code = (
        "import sys\n"
        "from flows.ui import ShownFlow\n"
        "flow = ShownFlow(lambda **k: k, name='p')\n"
        "flow.serialize_parameters({'seed': 3, 'overrides': ['a=1']})\n"
        "print('fastapi' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert result.stdout.strip() == "False", result.stderr
