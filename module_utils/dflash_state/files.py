"""Files and folders the stages compare with what they would write: existence, mode, sha256, and the
content or JSON where asked. A secret file (a key, an environment file with keys; `secret` on it or its folder)
is never hashed nor returned: the stages pass what they would write (`expect`, a no_log option of the module) and
get back only whether the file holds exactly that (`matches`), so no output lets a key be recovered."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
from typing import Any

# Content is returned only for small files (apt snippets, records); larger ones are hashed only.
MAX_CONTENT_BYTES = 1 << 20


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _owner(st: os.stat_result) -> tuple[str, str]:
    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return user, group


def read_file(path: str, content: bool = False, as_json: bool = False, children: bool = False, secret: bool = False,
              expect: dict[str, str] | None = None, mtime: bool = False) -> dict[str, Any]:
    """{path, exists, kind (file|dir|link), mode, owner, group, sha256, size[, target][, content | json]
    [, children][, mtime]} of one path (`mtime`, when asked: its modification time, seconds since the epoch, e.g.
    the deploy lock's heartbeat); `children` lists a folder's entries one level deep (JSON files parsed). A secret
    file (or any file in a secret folder) has `matches` (its bytes are exactly `expect[path]`; None when nothing is
    expected of it) instead of sha256 and content."""
    out: dict[str, Any] = {"path": path, "exists": os.path.lexists(path)}
    if not out["exists"]:
        return out
    if os.path.islink(path):
        out["target"] = os.readlink(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        out.update(kind="link", error=str(exc))
        return out
    user, group = _owner(st)
    out.update(mode=f"{st.st_mode & 0o7777:04o}", owner=user, group=group)
    if mtime:
        out["mtime"] = int(st.st_mtime)
    if os.path.isdir(path):
        out["kind"] = "dir"
        if children:
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                out["error"] = str(exc)
                names = []
            out["children"] = {n: read_file(os.path.join(path, n), as_json=n.endswith(".json") and not secret,
                                            secret=secret, expect=expect) for n in names}
        return out
    out["kind"] = "link" if "target" in out else "file"
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONTENT_BYTES + 1)
    except OSError as exc:
        out["error"] = str(exc)
        return out
    out.update(size=st.st_size)
    wanted = (expect or {}).get(path)
    if secret or wanted is not None:
        out["matches"] = None if wanted is None else data == wanted.encode("utf-8")
        return out
    if len(data) > MAX_CONTENT_BYTES:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        out["sha256"] = digest.hexdigest()
        return out
    out["sha256"] = sha256_of(data)
    if as_json:
        try:
            out["json"] = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            out["error"] = f"not JSON: {exc}"
    elif content:
        out["content"] = data.decode("utf-8", errors="replace")
    return out


def list_dir(path: str, suffix: str = "") -> list[str]:
    """Full paths of the regular files in a folder whose names end with `suffix`, sorted; [] when absent."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    return [os.path.join(path, n) for n in names if n.endswith(suffix) and os.path.isfile(os.path.join(path, n))]


def accounts(users: list[str], groups: list[str]) -> dict[str, Any]:
    """Which of the named users and groups exist ({users: {name: {uid, gid, home, shell}|None}, groups: ...})."""
    out: dict[str, Any] = {"users": {}, "groups": {}}
    for name in users:
        try:
            entry = pwd.getpwnam(name)
            out["users"][name] = {"uid": entry.pw_uid, "gid": entry.pw_gid, "home": entry.pw_dir,
                                  "shell": entry.pw_shell,
                                  "groups": sorted(g.gr_name for g in grp.getgrall() if name in g.gr_mem)}
        except KeyError:
            out["users"][name] = None
    for name in groups:
        try:
            out["groups"][name] = {"gid": grp.getgrnam(name).gr_gid}
        except KeyError:
            out["groups"][name] = None
    return out


def tree_modes(root: str) -> dict[str, list[str]]:
    """The distinct "mode owner:group" of a folder's files and of its folders (the root included), so a stage
    can tell a permission drift without listing every file; absent: both empty."""
    found: dict[str, set[str]] = {"files": set(), "dirs": set()}
    if not os.path.isdir(root):
        return {"files": [], "dirs": []}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for kind, names in (("dirs", [""]), ("files", [n for n in filenames if not n.startswith(".")])):
            for name in names:
                try:
                    st = os.lstat(os.path.join(dirpath, name) if name else dirpath)
                except OSError:
                    continue
                user, group = _owner(st)
                found[kind].add(f"{st.st_mode & 0o7777:04o} {user}:{group}")
    return {kind: sorted(values) for kind, values in found.items()}
