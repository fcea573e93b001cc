"""A data root in an object store at the command line (issue 71): what is wrong with it is one line on stderr with
exit status 2 before anything is downloaded or computed (a URL the lake refuses, a missing bucket, no credentials, a
command that does not work on a bucket yet), and ``RAGEN_DATA_ROOT`` names a bucket as ``--data-root`` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RAGEN = str(Path(sys.executable).with_name("ragen"))


def _ragen(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RAGEN, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr.strip()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["runs", "compact", "x", "--data-root", "{url}"], "unknown run 'x' in "),
        (["sql", "SELECT 1", "--data-root", "s3://Bad_Bucket/x"], "is not a valid S3 bucket name"),
        (
            ["sql", "SELECT 1", "--data-root", "s3://{bucket}/a/../b"],
            "the lake refuses: write it as s3://BUCKET/PREFIX",
        ),
        (["sql", "SELECT 1", "--data-root", "s3://no-such-bucket-x/lake"], "bucket 'no-such-bucket-x' does not exist"),
    ],
)
def test_mistakes_are_one_line_before_anything_is_done(s3_root, tmp_path, args, needle):
    url, _ = s3_root
    bucket = url.split("/")[2]
    line = _one_line(_ragen(*[a.format(url=url, bucket=bucket) for a in args]))
    assert needle in line, line
    assert not (tmp_path / "object-cache").exists() or not any((tmp_path / "object-cache").rglob("*.parquet"))


def test_no_credentials_is_one_line_naming_the_variables(s3_root, monkeypatch):
    url, _ = s3_root
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    line = _one_line(_ragen("runs", "--data-root", url))
    assert "no credentials for the object store of" in line and "AWS_ACCESS_KEY_ID" in line, line


def test_the_data_root_variable_names_a_bucket(s3_root):
    url, _ = s3_root
    result = _ragen("sql", "SELECT count(*) AS n FROM trajectories", "--format", "csv", env={"RAGEN_DATA_ROOT": url})
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == "0", result.stdout + result.stderr
