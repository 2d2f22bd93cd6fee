#!/usr/bin/env python3
"""Benchmark of the model sync on the lab (not a test): full sync vs a raw `rsync -a` of the same bytes between
the same containers, the no-op re-sync, and the bytes re-sent when resuming after a kill at about 50%.

The full sync is measured twice, with the source read from the page cache (as on production, where the source
does not share the destination's disk; the lab's containers do) and from disk, each against raw `rsync -a`,
raw `rsync -a` + `sync`, and (page cache only) a floor: raw `rsync -a` + `sync` with a sha256 of the same bytes
running beside it, the least any copy that checks every byte and has it on disk takes on this machine.

    make bench-sync                       # or: .venv/bin/python tools/bench_sync.py [--target-gib 4] [--draft-gib 0.5]

Fixtures of a few GB are written with lab/kit/make_models.py into .cache/bench-models, hard-linked into
ct129's /root/bench-models (through its rootfs), synced to ct200's /root/bench-dest with playbooks/sync_models.yml,
and deleted afterwards (--keep keeps them). The lab must be up (`make lab-up`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lab" / "kit"))
import make_models  # noqa: E402

SRC_ROOT = "/root/bench-models"
DEST_ROOT = "/root/bench-dest"
RAW_ROOT = "/root/bench-raw"
NAMES = (make_models.TARGET, make_models.DRAFT)
GIB = 1 << 30


sys.path.insert(0, str(REPO / "lab"))
import labctl  # noqa: E402  (lab/labctl.py: container table, ssh and /proc helpers)

PATHS = labctl.Paths(labctl.Settings.from_env().state)
CONTAINERS = {c.name: c for c in labctl.CONTAINERS}


def rootfs(host: str) -> Path:
    return PATHS.state / "machines" / host


def ssh(host: str, command: str, check: bool = True) -> str:
    """Run a bash command in a lab container over SSH with the lab key; returns stdout."""
    argv = labctl.ssh_argv(PATHS, CONTAINERS[host], "bash", "-c", shlex.quote(command))
    proc = subprocess.run(argv, text=True, capture_output=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise SystemExit(f"bench: `{command}` on {host} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def drop_caches() -> None:
    """Start each timed run from disk, not from the page cache of the previous one (shared host kernel)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


def playbook_argv(extra: dict[str, Any]) -> list[str]:
    evars = {"dflash_model_source_root": SRC_ROOT, "dflash_model_root": DEST_ROOT, **extra}
    return [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(REPO / "inventory/lab"), "-l", "ct200",
            "-e", json.dumps(evars), str(REPO / "playbooks/sync_models.yml")]


def play_env() -> dict[str, str]:
    return dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
                PATH=f"{REPO / '.venv/bin'}:{os.environ['PATH']}")


@dataclass
class Run:
    seconds: float
    tasks: dict[str, list[Any]]  # task name -> results (json callback)


def run_playbook(extra: dict[str, Any] | None = None, before: Any = None, attempts: int = 4) -> Run:
    """One timed run of the sync playbook. A run that finds ct129 unreachable (another engineer's `lab reset
    ct129` reboots it for ~12 s) is repeated from the same starting state (`before`)."""
    for attempt in range(attempts):
        if before is not None:
            before()
        place_fixtures()
        t0 = time.monotonic()
        proc = subprocess.run(playbook_argv(extra or {}), text=True, capture_output=True, env=play_env(), cwd=REPO)
        seconds = time.monotonic() - t0
        try:
            out = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise SystemExit(f"bench: the sync playbook printed no JSON (rc {proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}") from None
        if proc.returncode != 0 and out["stats"].get("ct200", {}).get("unreachable") and attempt + 1 < attempts:
            print("bench: ct129 was unreachable (rebooting?); waiting 20 s and running again")
            time.sleep(20)
            continue
        if proc.returncode != 0:
            raise SystemExit(f"bench: the sync playbook failed (rc {proc.returncode}): {json.dumps(out['stats'])}\n"
                             f"{proc.stdout[-3000:]}")
        tasks: dict[str, list[Any]] = {}
        for play in out["plays"]:
            for task in play["tasks"]:
                res = task["hosts"].get("ct200", {})
                tasks[task["task"]["name"]] = res.get("results", [res])
        return Run(seconds, tasks)
    raise SystemExit("bench: ct129 stayed unreachable")


def module_results(run: Run, task: str) -> list[dict[str, Any]]:
    """The dflash_model_sync results of one role task, per model (the json callback prefixes "model_sync : ")."""
    results = next((rs for name, rs in run.tasks.items() if name.split(" : ", 1)[-1] == task), [])
    return [r for r in results if not r.get("skipped") and "io_read_bytes" in r]


CACHE = REPO / ".cache" / "bench-models"


def make_fixtures(target_bytes: int, draft_bytes: int) -> int:
    """Bench models in .cache/bench-models (generated once per size); returns their bytes."""
    stamp = CACHE / ".bench-stamp"
    want = f"{target_bytes}:{draft_bytes}"
    if not (stamp.is_file() and stamp.read_text() == want):
        subprocess.run(["rm", "-rf", "--one-file-system", str(CACHE)], check=True)
        t0 = time.monotonic()
        make_models.make_target(CACHE, target_bytes)
        make_models.make_draft(CACHE, draft_bytes)
        stamp.write_text(want)
        print(f"fixtures: {CACHE} written in {time.monotonic() - t0:.1f} s")
    place_fixtures()
    return sum(p.stat().st_size for n in NAMES for p in (CACHE / n).iterdir() if p.is_file())


def place_fixtures() -> None:
    """Hard-link the fixtures into ct129's /root/bench-models (no extra disk; again after a `reset ct129`)."""
    out = rootfs("ct129") / SRC_ROOT.lstrip("/")
    if not all((out / n).is_dir() for n in NAMES):
        subprocess.run(["rm", "-rf", "--one-file-system", str(out)], check=True)
        out.mkdir(parents=True)
        for n in NAMES:
            subprocess.run(["cp", "-al", str(CACHE / n), str(out / n)], check=True)


def clear_dest() -> None:
    ssh("ct200", f"rm -rf {DEST_ROOT} {RAW_ROOT} /var/lib/dflash-infra/models")


def staged_bytes() -> int:
    base = rootfs("ct200") / DEST_ROOT.lstrip("/") / ".dflash-staging"
    return sum(p.stat().st_size for p in base.rglob("*") if p.is_file()) if base.is_dir() else 0


def raw_rsync(flush: bool = False) -> float:
    """`rsync -a` of the same directories, on ct200 pulling from ct129 with the same key, cipher and rrsync;
    with flush, until the copied bytes are on disk (`sync`), as the sync tool's fsync before rename ensures."""
    e = ("ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes "
         "-i /root/.ssh/dflash_model_sync_ed25519 "
         "-o UserKnownHostsFile=/root/.ssh/dflash_model_sync_known_hosts -o GlobalKnownHostsFile=/dev/null "
         "-c aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com")
    addr = CONTAINERS["ct129"].address
    cmds = "; ".join(f"rsync -a -e {shlex.quote(e)} root@{addr}:{n}/ {RAW_ROOT}/{n}/" for n in NAMES)
    then_sync = "; sync" if flush else ""
    out = ssh("ct200", f"rm -rf {RAW_ROOT}; mkdir -p {RAW_ROOT}; TIMEFORMAT=%R; time ( {cmds}{then_sync} ) 2>&1")
    return float(out.strip().splitlines()[-1])


# The sync's own hashing (the scan of module_utils/dflash_sync, no cache), run on the host over the fixture
# directories, whose files are the source's files (hard links, so the same page cache).
_HASH_BESIDE = "import sys; from pathlib import Path; from dflash_sync import manifest; " \
               "[manifest.scan(Path(root)) for root in sys.argv[1:]]"


def fixture_files() -> list[str]:
    return sorted(str(p) for n in NAMES for p in (CACHE / n).iterdir() if p.is_file())


def warm_source() -> None:
    """Read the source files once, so the timed run reads them from the page cache."""
    for path in fixture_files():
        with open(path, "rb", buffering=0) as fh:
            while fh.read(8 << 20):
                pass


def floor_rsync() -> float:
    """`rsync -a`, then `sync`, while the same bytes are hashed by sha256 beside it: the least that any copy
    which checks every byte against the manifest and has it on disk takes on this machine (the hashing wants
    CPU time the transfer also wants). Only with the source in the page cache (the hashing adds no disk reads)."""
    hasher = subprocess.Popen([sys.executable, "-c", _HASH_BESIDE, *(str(CACHE / n) for n in NAMES)], cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=str(REPO / "module_utils")))
    try:
        return raw_rsync(flush=True)
    finally:
        if hasher.wait() != 0:
            raise SystemExit(f"bench: the sha256 beside the raw rsync exited {hasher.returncode}")


@dataclass
class Measured:
    """Medians (and runs) of one condition."""

    raws: list[float]
    flushed: list[float]
    floors: list[float]
    tools: list[float]
    transfers: list[float]
    playbooks: list[float]
    hashed: int
    streamed: int

    raw = property(lambda self: statistics.median(self.raws))
    raw_flushed = property(lambda self: statistics.median(self.flushed))
    floor = property(lambda self: statistics.median(self.floors) if self.floors else 0.0)
    tool = property(lambda self: statistics.median(self.tools))
    transfer = property(lambda self: statistics.median(self.transfers))
    playbook = property(lambda self: statistics.median(self.playbooks))


def measure(repeat: int, warm_src: bool) -> Measured:
    """Interleaved runs of raw rsync, raw rsync + sync, the floor (source in the page cache only) and the sync
    playbook, each from an empty destination and dropped caches (then the source read again when warm_src)."""
    def start() -> None:
        drop_caches()
        if warm_src:
            warm_source()

    def fresh() -> None:
        clear_dest()
        start()

    m = Measured([], [], [], [], [], [], 0, 0)
    for _ in range(repeat):
        start()
        m.raws.append(raw_rsync())
        start()
        m.flushed.append(raw_rsync(flush=True))
        if warm_src:
            start()
            m.floors.append(floor_rsync())
        run = run_playbook(before=fresh)
        reports = module_results(run, "Copy, verify and move the models into place")
        m.playbooks.append(run.seconds)
        m.tools.append(sum(r["seconds"] for r in reports))
        m.transfers.append(sum(t["seconds"] for r in reports for t in r["transfers"]))
        m.hashed = sum(r["hashed_bytes"] for r in reports)
        m.streamed = sum(r["hashed_while_receiving"] for r in reports)
    return m


def report(m: Measured, total: int) -> None:
    print(f"  raw rsync -a (same ssh key, cipher, rrsync):      {m.raw:7.2f} s  {mb_s(total, m.raw)}"
          f"  (runs {fmt(m.raws)})")
    print(f"  raw rsync -a, then sync (bytes on disk):          {m.raw_flushed:7.2f} s  {mb_s(total, m.raw_flushed)}"
          f"  (runs {fmt(m.flushed)})")
    if m.floors:
        print(f"  floor: raw rsync -a + sync, sha256 beside it:     {m.floor:7.2f} s  ratio {m.floor / m.raw:.3f}"
              f"  (runs {fmt(m.floors)}; the least a copy verified by sha256 and on disk takes here)")
    print(f"  sync tool (plan, rsync, sha256 verify, commit):   {m.tool:7.2f} s  ratio {m.tool / m.raw:.3f}, "
          f"{m.tool / m.raw_flushed:.3f} against raw + sync" + (f", {m.tool / m.floor:.3f} against the floor"
                                                                if m.floors else "") + f"  (runs {fmt(m.tools)})")
    print(f"    its rsync alone {m.transfer:.2f} s; verify + commit after rsync {m.tool - m.transfer:.2f} s; "
          f"{m.streamed / 1e9:.2f} of {m.hashed / 1e9:.2f} GB hashed while rsync was still writing the file")
    print(f"  whole playbook incl. ansible overhead:            {m.playbook:7.2f} s  ratio {m.playbook / m.raw:.3f}"
          f"  (runs {fmt(m.playbooks)})")


def fmt(values: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values) + " s"


def mb_s(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:.0f} MB/s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-gib", type=float, default=4.0)
    ap.add_argument("--draft-gib", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved raw/sync pairs (medians are printed)")
    ap.add_argument("--keep", action="store_true", help="keep the fixtures and copies afterwards")
    args = ap.parse_args(argv)
    status = subprocess.run([sys.executable, str(REPO / "lab/labctl.py"), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        raise SystemExit("bench: the lab is not up; run `make lab-up` first\n" + status.stdout)
    total = make_fixtures(int(args.target_gib * GIB), int(args.draft_gib * GIB))
    print(f"fixtures: {total / 1e9:.2f} GB in ct129:{SRC_ROOT} ({', '.join(NAMES)})")
    try:
        # Cold: the source manifest is computed (and cached) during this sync.
        def cold_start() -> None:
            ssh("ct129", "rm -f " + " ".join(f"/var/cache/dflash-infra/manifests/{n}.json" for n in NAMES), check=False)
            clear_dest()
            drop_caches()

        cold = run_playbook(before=cold_start)
        cold_tool = sum(r["seconds"] for r in module_results(cold, "Copy, verify and move the models into place"))
        # Warm: the normal case, the source manifest is cached; the destination is empty again. Interleaved repeats
        # (raw, raw + sync, [floor,] sync, ...): the host is shared, so single runs drift. Two conditions: the source
        # read from the page cache (as on production, where the source's disk is not the destination's; the lab's
        # containers share one disk) and from disk (caches dropped; the destination's flushes compete with the reads).
        results = {warm_src: measure(args.repeat, warm_src) for warm_src in (True, False)}
        # No-op re-sync.
        noop = run_playbook()
        scans = module_results(noop, "Compute the manifests at the source in one call (cached by size and mtime)")
        plans = module_results(noop, "Compare the destination with the manifests and check the free space")
        # Resume after a kill at ~50%.
        clear_dest()
        drop_caches()
        bg = subprocess.Popen(playbook_argv({}), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=play_env(),
                              cwd=REPO)
        while staged_bytes() < total * 0.5 and bg.poll() is None:
            time.sleep(0.05)
        at = staged_bytes()
        ctl = rootfs("ct200") / DEST_ROOT.lstrip("/") / ".dflash-staging" / f"{make_models.TARGET}.transfer.json"
        c = json.loads(ctl.read_text())
        ssh("ct200", f"kill -KILL -- -{c['rsync_pgid']} {c['pid']}", check=False)
        bg.wait()
        resumed = run_playbook(attempts=1)
        rep = {r["name"]: r for r in module_results(resumed, "Copy, verify and move the models into place")}
        literal = sum(t["stats"].get("literal_data", 0) for r in rep.values() for t in r["transfers"])
        received = sum(t["stats"].get("total_bytes_received", 0) for r in rep.values() for t in r["transfers"])
        partial = sum(t["resumed_bytes"] for r in rep.values() for t in r["transfers"])
        pulled = sum(t["bytes"] for r in rep.values() for t in r["transfers"])
        missing = pulled - partial
        print()
        print(f"== model sync benchmark, lab ct129 -> ct200, {total / 1e9:.2f} GB "
              f"({make_models.TARGET} 15 shards + {make_models.DRAFT})")
        for warm_src, m in results.items():
            print(f"-- source read from {'the page cache (production-like)' if warm_src else 'disk (caches dropped)'}; "
                  f"medians of {args.repeat} interleaved runs")
            report(m, total)
        m = results[True]
        print(f"full sync, cold (source manifest computed too):   {cold.seconds:7.2f} s  "
              f"ratio {cold.seconds / m.raw:.3f}  (sync tool {cold_tool:.2f} s)")
        print(f"no-op re-sync (whole playbook):                   {noop.seconds:7.2f} s  changed="
              f"{sum(1 for rs in noop.tasks.values() for r in rs if r.get('changed'))}; hashed "
              f"{sum(s['scan']['hashed_bytes'] for s in scans)} B at the source, "
              f"{sum(p['plan']['hashed_bytes'] for p in plans)} B"
              f" at the destination; read() bytes {sum(s['io_read_bytes'] for s in scans)} (source scan) + "
              f"{sum(p['io_read_bytes'] for p in plans)} (destination plan) of {total} model bytes")
        print(f"resume after SIGKILL at {at / total:.0%} ({at / 1e9:.2f} GB in staging): re-sync "
              f"{resumed.seconds:.2f} s; still missing {missing / 1e9:.3f} GB (+{partial / 1e9:.3f} GB in a partial "
              f"file); sent as data {literal / 1e9:.3f} GB, bytes received incl. protocol {received / 1e9:.3f} GB; "
              f"re-sent beyond what was missing: {(literal - missing) / 1e6:.2f} MB")
    finally:
        if not args.keep:
            clear_dest()
            for path in (rootfs("ct129") / SRC_ROOT.lstrip("/"), CACHE):
                subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)
            ssh("ct129", "rm -f " + " ".join(f"/var/cache/dflash-infra/manifests/{n}.json" for n in NAMES), check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
