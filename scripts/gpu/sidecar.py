"""Runs beside the study on the H200 (image python3: pynvml, psutil): every second one pynvml
reading of GPU 0 (memory info, running compute processes, utilisation) to nvml.jsonl; every 3 s a
/metrics scrape of any running engine server (the first and the latest per server, named by engine,
port and pid, so the study's argv maps them to trials); every 30 s one nvidia-smi CSV line. These
are the captures the tests replay (tests/data/captures/*-h200-*/). Stops when STOP_FILE exists.

    python3 sidecar.py OUT_DIR STOP_FILE
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pynvml

MODULES = {"vllm.entrypoints.openai.api_server": "vllm", "sglang.launch_server": "sglang"}


def servers() -> list[tuple[str, int, int]]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        engine = next((e for m, e in MODULES.items() if m in cmd), None)
        if engine and "--port" in cmd:
            found.append((engine, int(cmd[cmd.index("--port") + 1]), proc.info["pid"]))
    return found


def scrape(out: Path, seen: set[str]) -> None:
    for engine, port, pid in servers():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                text = r.read().decode("utf-8", "replace")
        except Exception:  # noqa: BLE001 - not up yet, or gone
            continue
        tag = f"{engine}-port{port}-pid{pid}"
        stamp = f"# scraped {time.strftime('%Y-%m-%dT%H:%M:%S')} from {engine} on port {port}\n"
        if tag not in seen:
            (out / f"{tag}-first.prom").write_text(stamp + text)
            seen.add(tag)
        (out / f"{tag}-last.prom").write_text(stamp + text)


def main(out: Path, stop: Path) -> None:
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    seen: set[str] = set()
    with (out / "nvml.jsonl").open("a") as f:
        head = {
            "name": pynvml.nvmlDeviceGetName(h),
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "nvml_version": pynvml.nvmlSystemGetNVMLVersion(),
            "count": pynvml.nvmlDeviceGetCount(),
        }
        f.write(json.dumps({k: v.decode() if isinstance(v, bytes) else v for k, v in head.items()}) + "\n")
        n = 0
        while not stop.exists():
            try:
                m = pynvml.nvmlDeviceGetMemoryInfo(h)
                procs = [[p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
                util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
                row = {"t": round(time.time(), 2), "total": m.total, "used": m.used, "free": m.free,
                       "util": util, "procs": procs}  # fmt: skip
                f.write(json.dumps(row) + "\n")
                f.flush()
            except pynvml.NVMLError as exc:
                f.write(json.dumps({"t": round(time.time(), 2), "error": str(exc)}) + "\n")
            if n % 3 == 0:
                scrape(out / "metrics", seen)
            if n % 30 == 0:
                q = "name,memory.used,memory.total,utilization.gpu,power.draw"
                csv = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True, text=True)
                with (out / "nvidia_smi.csv").open("a") as g:
                    g.write(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')}\n{csv.stdout}")
            n += 1
            time.sleep(1.0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
