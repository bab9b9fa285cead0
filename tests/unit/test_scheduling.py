"""The suite's own scheduler (tests/scheduling.py) on a small suite run by xdist as scripts/test.sh runs
it: the engine files start first, most boots first, only the lightest file waits behind an engine
file's last test, and every test runs (a worker left waiting for its next test would hang the run)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIGHT = "import time\n\ndef test_a():\n    time.sleep(0.2)\n\ndef test_b():\n    time.sleep(0.2)\n"


def _engine_file(boots: int, seconds: float, tests: int) -> str:
    body = "".join(f"\ndef test_{i}():\n    time.sleep({seconds})\n" for i in range(tests))
    return f"import time\n\nimport pytest\n\npytestmark = pytest.mark.engine(boots={boots})\n{body}"


def test_engine_files_first_and_only_light_files_behind_them(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.scheduling"]\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers = engine(boots=N): boots an engine\n")
    lights = [f"test_light{i}.py" for i in range(1, 7)]
    for name in lights:
        (tmp_path / name).write_text(LIGHT)
    # named to sort after the light files: pytest's own order would start them last
    (tmp_path / "test_zone.py").write_text(_engine_file(1, 3.0, 1))
    (tmp_path / "test_zthree.py").write_text(_engine_file(3, 2.0, 2))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "-v"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (test_\w+\.py)::", done.stdout)
    assert len(ran) == 6 * 2 + 1 + 2, done.stdout
    files: dict[str, list[str]] = defaultdict(list)
    for worker, name in ran:
        if name not in files[worker]:
            files[worker].append(name)
    firsts = {order[0] for order in files.values()}
    assert firsts == {"test_zthree.py", "test_zone.py"}, files
    # behind each engine file's last test: the last light file of the queue, then the next from the front
    follow = {order[order.index(e) + 1] for order in files.values() for e in order if e.startswith("test_z")}
    assert follow <= {"test_light6.py", "test_light5.py"}, files
