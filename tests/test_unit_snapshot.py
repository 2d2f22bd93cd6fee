"""library/dflash_unit_snapshot.py run for real on localhost (`ansible localhost -m`, the host's python3): the
snapshot the engine's role keeps after the gates (the unit and its environment file, last-good pointed at it, the
deployment record written last) and the backup of a unit about to be replaced (a file that does not exist left out)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from helpers import run_module


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_snapshot_copies_points_last_good_and_writes_the_record_last(tmp_path: Path) -> None:
    unit, env = tmp_path / "sglang-qwen-r0.service", tmp_path / "sglang-qwen-r0.env"
    unit.write_text("[Service]\nExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server\n")
    env.write_text("SGLANG_API_KEY=not-a-secret\n")
    env.chmod(0o600)
    units = tmp_path / "units"
    units.mkdir()
    (units / "20261201T000000Z-deployed").mkdir()
    last_good = units / "last-good"
    last_good.symlink_to("20261201T000000Z-deployed")
    record = tmp_path / "deployment.json"
    record.write_text('{"deployed_at": "2026-12-01"}\n')
    content = json.dumps({"deployed_at": "2026-12-03", "unit": {"backup": str(units / "20261203T000000Z-deployed")}})
    args = {"files": [str(unit), str(env)], "dest": str(units / "20261203T000000Z-deployed"), "link": str(last_good),
            "record": {"path": str(record), "content": content + "\n"}}

    checked = run_module("dflash_unit_snapshot", args, check=True)
    assert checked["changed"] is True and checked["linked"] is True and checked["recorded"] is True, checked
    assert not (units / "20261203T000000Z-deployed").exists() and os.readlink(last_good) == "20261201T000000Z-deployed"
    assert record.read_text() == '{"deployed_at": "2026-12-01"}\n'

    done = run_module("dflash_unit_snapshot", args, diff=True)
    assert not done.get("failed") and done["changed"] is True, done
    snapshot = units / "20261203T000000Z-deployed"
    assert mode(snapshot) == 0o700 and sorted(p.name for p in snapshot.iterdir()) == sorted([unit.name, env.name])
    assert (snapshot / unit.name).read_text() == unit.read_text() and mode(snapshot / unit.name) == 0o600
    assert (snapshot / env.name).read_text() == env.read_text() and mode(snapshot / env.name) == 0o600
    assert os.readlink(last_good) == "20261203T000000Z-deployed"  # relative, in the same folder
    assert record.read_text() == content + "\n" and mode(record) == 0o644
    assert done["diff"]["before"] == '{"deployed_at": "2026-12-01"}\n' and done["diff"]["after"] == content + "\n"
    assert not [p for p in (tmp_path, units, snapshot) for q in p.iterdir() if q.name.startswith(".")]  # no temporaries

    # Again with the same snapshot: the link and the record are left alone (the copies are written again).
    again = run_module("dflash_unit_snapshot", args)
    assert again["linked"] is False and again["recorded"] is False and again["copied"] == [str(unit), str(env)]


def test_the_backup_leaves_out_a_file_that_does_not_exist(tmp_path: Path) -> None:
    unit = tmp_path / "sglang-qwen.service"
    unit.write_text("[Service]\n")
    dest = tmp_path / "units" / "20261203T000000Z-replaced"
    result = run_module("dflash_unit_snapshot", {"files": [str(unit), str(tmp_path / "sglang-qwen.env")],
                                                 "dest": str(dest)})
    assert result["changed"] is True and result["missing"] == [str(tmp_path / "sglang-qwen.env")], result
    assert [p.name for p in dest.iterdir()] == [unit.name] and result["linked"] is False
    assert result["recorded"] is False
