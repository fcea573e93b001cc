"""A stop that lands while a module is being imported is raised once the import is done (ragen_cli.interrupts): an
exception thrown through an extension module's initialisation (DuckDB's bindings) aborted `ragen sql` with SIGABRT
instead of stopping it. A planted module whose import takes seconds stands for it: SIGTERM in the middle of its
import stops the command after the import completed, at once and as a stop, not a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from ragen_cli import interrupts
    interrupts.install()
    sys.path.insert(0, sys.argv[1])
    try:
        import slow_to_import
        time.sleep(30)
        print("not stopped")
    except KeyboardInterrupt:
        done = getattr(sys.modules.get("slow_to_import"), "DONE", False)
        print(f"stopped after the import: {done}, exit {interrupts.exit_code()}", flush=True)
        sys.exit(interrupts.exit_code())
""")


@pytest.mark.process
def test_a_stop_during_an_import_lands_once_it_is_done(tmp_path):
    started = tmp_path / "started"
    (tmp_path / "slow_to_import.py").write_text(
        "import time\nfrom pathlib import Path\n"
        f"Path({str(started)!r}).touch()\n"
        "for _ in range(20):\n    time.sleep(0.1)  # two seconds of import, in small steps\n"
        "DONE = True\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not started.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.01)
    sent = time.monotonic()
    os.kill(process.pid, signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 143, (out, err)
    assert out.strip() == "stopped after the import: True, exit 143", (out, err)
    assert time.monotonic() - sent < 10  # the rest of the import (< 2 s), then at once: not the 30 s sleep
    assert "Traceback" not in err
