"""Build the device check's bundle: what travels to a lent GPU machine that has no network.

    python device/bundle.py [--out .devrun] [--cache .devrun-cache] [--build-python PYTHON] [--limit-mib 60]

``make device-bundle`` runs it. The bundle folder (ignored by git) holds:

- ``whl/``: the wheels of ``device/pins.txt`` (what the GPU image lacks) for CPython 3.12 on manylinux x86-64,
  downloaded from the package index once into ``--cache``; DeepSpeed built from its sdist as a pure wheel
  (``DS_BUILD_OPS=0``, by ``--build-python``, which must have torch: DeepSpeed's build imports it); Prefect's wheel
  repacked without its web UI's static files (nothing here serves the UI);
- ``whl-fallback/``: the wheels of ``device/pins-fallback.txt``, installed there only where needed;
- ``proj/``: the project at the committed ``HEAD`` (``git archive``; uncommitted changes do not travel), without
  ``docs/`` (nothing the device check runs reads it; its figures are most of the source's size);
- ``run.sh``, ``depcheck.py``, ``report.py`` from ``device/``, and ``BUNDLE.txt`` (commit, date, sizes).

The whole folder must stay within ``--limit-mib`` (what the device tool carries, with room to spare); a larger bundle
fails the build, naming its largest parts.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PLATFORM_FLAGS = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "any",
]
BUILT_FROM_SOURCE = {"deepspeed"}  # an sdist only: built here (see build_deepspeed)
LEFT_AT_HOME = ("docs/",)  # parts of the source that do not travel
UI_PREFIXES = ("prefect/server/ui/", "prefect/server/ui-v2/", "prefect/server/ui_build/")
CARRIED_SCRIPTS = ("run.sh", "depcheck.py", "report.py")


class BundleError(RuntimeError):
    """The bundle cannot be built as asked; the message says why and what to do."""


def read_pins(path: Path) -> list[tuple[str, str]]:
    """(name, version) of every ``name==version`` line of a pins file (comments and blank lines skipped)."""
    pins = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, sep, version = text.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise BundleError(f"{path}:{number}: expected NAME==VERSION, got {text!r}")
        pins.append((name.strip(), version.strip()))
    return pins


def normalised(name: str) -> str:
    """A distribution name as wheel file names spell it (lower case, ``_`` for ``-`` and ``.``)."""
    return name.lower().replace("-", "_").replace(".", "_")


def cached_wheel(cache: Path, name: str, version: str) -> Path | None:
    """The cached wheel of ``name==version``, if any."""
    for path in cache.glob("*.whl"):
        stem = path.name.split("-")
        if len(stem) >= 2 and normalised(stem[0]) == normalised(name) and stem[1] == version:
            return path
    return None


def download(cache: Path, name: str, version: str) -> Path:
    """The wheel of ``name==version`` for the GPU image's Python, from the cache or the package index."""
    found = cached_wheel(cache, name, version)
    if found:
        return found
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "-q",
        "-d",
        str(cache),
        *PLATFORM_FLAGS,
        f"{name}=={version}",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    found = cached_wheel(cache, name, version)
    if done.returncode or not found:
        raise BundleError(f"no wheel of {name}=={version} for CPython 3.12 manylinux x86-64: {done.stderr.strip()}")
    return found


def build_deepspeed(cache: Path, version: str, python: str) -> Path:
    """DeepSpeed ``version`` as a pure wheel (``DS_BUILD_OPS=0``), built by ``python`` (which must import torch)."""
    found = cached_wheel(cache, "deepspeed", version)
    if found:
        return found
    probe = subprocess.run([python, "-c", "import torch, setuptools"], capture_output=True, text=True)
    if probe.returncode:
        raise BundleError(
            f"--build-python {python} cannot import torch and setuptools (DeepSpeed's build "
            "needs them): point DEVICE_BUILD_PYTHON at a Python that has them"
        )
    env = {**os.environ, "DS_BUILD_OPS": "0"}
    command = [
        python,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(cache),
        f"deepspeed=={version}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    found = cached_wheel(cache, "deepspeed", version)
    if done.returncode or not found:
        raise BundleError(f"building deepspeed=={version} failed: {done.stderr.strip()[-2000:]}")
    return found


def without_ui(wheel: Path, target: Path) -> Path:
    """A copy of Prefect's wheel at ``target`` without the web UI's static files, its RECORD rewritten to match."""
    kept_record: list[str] = []
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        record_name = next(n for n in source.namelist() if n.endswith(".dist-info/RECORD"))
        for info in source.infolist():
            if info.filename.startswith(UI_PREFIXES) or info.filename == record_name:
                continue
            data = source.read(info.filename)
            out.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            kept_record.append(f"{info.filename},sha256={digest},{len(data)}")
        kept_record.append(f"{record_name},,")
        out.writestr(record_name, "\n".join(kept_record) + "\n")
    return target


def project_source(out: Path) -> str:
    """The committed ``HEAD`` of this repository but :data:`LEFT_AT_HOME`, unpacked at ``out``; returns the commit
    (with a warning on stderr when the work tree has uncommitted changes, which do not travel)."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    if dirty:
        print("device-bundle: warning: uncommitted changes are not in the bundle (git archive HEAD)", file=sys.stderr)
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=REPO, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        members = [m for m in tar.getmembers() if not m.name.startswith(LEFT_AT_HOME)]
        tar.extractall(out, members=members, filter="data")
    return commit.stdout.strip()


def folder_size(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def largest(path: Path, count: int = 8) -> list[tuple[int, str]]:
    """The ``count`` largest files under ``path`` (bytes, relative path)."""
    sizes = [(p.stat().st_size, str(p.relative_to(path))) for p in path.rglob("*") if p.is_file()]
    return sorted(sizes, reverse=True)[:count]


def build(out: Path, cache: Path, build_python: str, limit_mib: float) -> int:
    """Build the bundle at ``out`` (replacing it); returns its size in bytes. Raises :class:`BundleError`."""
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    if out.exists():
        shutil.rmtree(out)
    for sub in ("whl", "whl-fallback", "proj"):
        (out / sub).mkdir(parents=True)
    wheels = []
    for name, version in read_pins(HERE / "pins.txt"):
        wheel = (
            build_deepspeed(cache, version, build_python)
            if name in BUILT_FROM_SOURCE
            else download(cache, name, version)
        )
        target = out / "whl" / wheel.name
        without_ui(wheel, target) if normalised(name) == "prefect" else shutil.copy2(wheel, target)
        wheels.append(target)
    for name, version in read_pins(HERE / "pins-fallback.txt"):
        shutil.copy2(download(cache, name, version), out / "whl-fallback")
    commit = project_source(out / "proj")
    for script in CARRIED_SCRIPTS:
        shutil.copy2(HERE / script, out / script)
    (out / "run.sh").chmod(0o755)
    size = folder_size(out)
    parts = {sub: folder_size(out / sub) for sub in ("whl", "whl-fallback", "proj")}
    lines = [
        f"commit {commit}",
        f"built {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
        f"size {size / 2**20:.1f} MiB: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in parts.items()),
        f"wheels {len(wheels)}: " + " ".join(sorted(p.name for p in wheels)),
    ]
    (out / "BUNDLE.txt").write_text("\n".join(lines) + "\n")
    if size > limit_mib * 2**20:
        parts_text = "; ".join(f"{name} {n / 2**20:.1f} MiB" for n, name in largest(out))
        raise BundleError(
            f"the bundle is {size / 2**20:.1f} MiB, over the {limit_mib:g} MiB limit; largest: {parts_text}"
        )
    print(
        f"device-bundle: {out} {size / 2**20:.1f} MiB ({len(wheels)} wheels, commit {commit[:10]}) in "
        f"{time.monotonic() - started:.0f} s"
    )
    return size


def main(argv: list[str] | None = None) -> int:
    """Command line: build the bundle; errors in one line on stderr, exit 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / ".devrun", help="The bundle folder (replaced).")
    parser.add_argument("--cache", type=Path, default=REPO / ".devrun-cache", help="Downloaded and built wheels.")
    parser.add_argument("--build-python", default=sys.executable, help="A Python with torch, to build DeepSpeed.")
    parser.add_argument("--limit-mib", type=float, default=60.0, help="The most the bundle may weigh.")
    args = parser.parse_args(argv)
    try:
        build(args.out.resolve(), args.cache.resolve(), args.build_python, args.limit_mib)
    except (BundleError, subprocess.CalledProcessError) as exc:
        print(f"device-bundle: error: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
