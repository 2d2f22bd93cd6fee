"""Benchmark of serving through the gateway on the lab (not a test): figures of one run, no limits asserted.

On ct200 served through the real SGLang Model Gateway (deploy_dflash.yml with dflash_serve_through_gateway; the
engines are the lab's stand-ins, so the figures are the gateway's own overhead, not a model's speed), in one run:
Locust at the same users and duration through the gateway and straight to replica 0, alternated three times
(medians printed), their ratio, and the failed requests of a rolling redeploy of a changed plan under load.
    make bench-serve              # BENCH_SERVE_USERS=8 BENCH_SERVE_SECONDS=20
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from load import Load  # noqa: E402

sys.path.insert(0, str(REPO / "lab"))
from labbuilder import config  # noqa: E402

BIN = Path(sys.executable).parent
ENV = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
           PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
USERS = int(os.environ.get("BENCH_SERVE_USERS", "8"))
SECONDS = float(os.environ.get("BENCH_SERVE_SECONDS", "20"))
ROUNDS = 3


def deploy(extra: dict[str, Any]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([str(BIN / "ansible-playbook"), "deploy_dflash.yml", "-i", "inventory/lab", "-l", "ct200",
                           "-e", json.dumps({"dflash_serve_through_gateway": True, **extra})],
                          cwd=REPO, env=ENV, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"deploy failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    return time.perf_counter() - start


def measure(url: str, folder: Path) -> dict[str, Any]:
    load = Load(url, folder, users=USERS)
    time.sleep(SECONDS)
    return load.stop()


def median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def main() -> None:
    subprocess.run([sys.executable, "lab/labctl.py", "up"], cwd=REPO, check=True, capture_output=True)
    host = next(c.address for c in config.CONTAINERS if c.name == "ct200")
    deploy({})
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    through, direct = [], []
    for i in range(ROUNDS):
        through.append(measure(f"http://{host}:30000", work / f"gateway-{i}"))
        direct.append(measure(f"http://{host}:30001", work / f"replica-{i}"))
    print(f"bench-serve: {USERS} users, {SECONDS:.0f} s per measurement, medians of {ROUNDS} alternated runs "
          "(lab stand-in engines: the gateway's overhead, not a model's speed)")
    for name, runs in (("through the gateway (4 replicas)", through), ("straight to replica 0", direct)):
        print(f"  {name:34s} {median(runs, 'requests_per_s'):8.1f} req/s   p50 {median(runs, 'p50_ms'):6.1f} ms   "
              f"p99 {median(runs, 'p99_ms'):6.1f} ms   failed {sum(r['failed'] for r in runs)}")
    ratios = [median(through, key) / max(median(direct, key), 1.0) for key in ("requests_per_s", "p50_ms", "p99_ms")]
    print(f"  ratio gateway / one replica:      {ratios[0]:.2f} x req/s, {ratios[1]:.2f} x p50, {ratios[2]:.2f} x p99")
    load = Load(f"http://{host}:30000", work / "rollout", users=USERS)
    seconds = deploy({"dflash_plan_overrides": {"max_running_requests": 20}})
    rolled = load.stop()
    deploy({})  # back to the group's plan (another rolling redeploy)
    print(f"  rolling redeploy of a changed plan under load: {seconds:.1f} s, {rolled['requests']} requests, "
          f"{rolled['failed']} failed")
    if rolled["failures"]:
        print(rolled["failures"])


if __name__ == "__main__":
    main()
