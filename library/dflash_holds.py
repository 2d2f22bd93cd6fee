#!/usr/bin/python
"""Ansible module dflash_holds: hold a set of installed packages (dpkg selection "hold") in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
module: dflash_holds
short_description: Hold every package of a set, in one dpkg call
description:
  - Reads the selection of every package of I(names) with one C(dpkg-query), and gives the ones not on hold their
    hold with one C(dpkg --set-selections), then reads them again. C(ansible.builtin.dpkg_selections) takes one
    round trip per package.
  - A package of I(names) that dpkg does not know (not installed) fails the task, naming it, instead of the silent
    warning of C(dpkg --set-selections): the set is held after its transaction, when every package of it is there.
  - Under check mode nothing is written; C(changed) says whether anything would be.
options:
  names: {description: The packages to hold., type: list, elements: str, required: true}
  admindir: {description: dpkg's database folder (its --admindir)., type: path, default: /var/lib/dpkg}
"""

RETURN = r"""
held: {description: The packages given their hold by this run (or that would be, under check mode)., type: list,
       returned: always}
already: {description: The packages that were on hold already., type: list, returned: always}
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule


def selections(module: AnsibleModule, names: list[str]) -> dict[str, str]:
    """package -> its selection (install, hold, deinstall, purge) for the names dpkg knows, in one dpkg-query."""
    admindir = module.params["admindir"]
    rc, out, err = module.run_command(["dpkg-query", f"--admindir={admindir}", "-W",
                                       "-f=${binary:Package}\t${Package}\t${db:Status-Want}\t${db:Status-Status}\n",
                                       *names])
    if rc not in (0, 1):  # 1: some name is not known (reported per name below)
        module.fail_json(msg=f"dpkg-query failed ({rc}): {err.strip()}")
    found: dict[str, str] = {}
    for line in out.splitlines():
        fields = line.split("\t")
        if len(fields) == 4 and fields[3] not in ("", "not-installed", "config-files"):
            found[fields[1]] = found[fields[0]] = fields[2]
    return found


def main() -> None:
    module = AnsibleModule(argument_spec={"names": {"type": "list", "elements": "str", "required": True},
                                          "admindir": {"type": "path", "default": "/var/lib/dpkg"}},
                           supports_check_mode=True)
    names = list(dict.fromkeys(module.params["names"]))
    result: dict[str, Any] = {"changed": False, "held": [], "already": []}
    if not names:
        module.exit_json(**result)
    found = selections(module, names)
    missing = [n for n in names if n not in found]
    if missing:
        module.fail_json(msg=f"expected every package to hold installed, found {', '.join(missing)} not installed "
                             "(hold the set after the transaction that installs it)", **result)
    result["already"] = [n for n in names if found[n] == "hold"]
    result["held"] = [n for n in names if found[n] != "hold"]
    result["changed"] = bool(result["held"])
    if result["changed"] and not module.check_mode:
        data = "".join(f"{name} hold\n" for name in result["held"])
        rc, _, err = module.run_command(["dpkg", f"--admindir={module.params['admindir']}", "--set-selections"],
                                        data=data, binary_data=True)
        after = selections(module, result["held"])
        unheld = [n for n in result["held"] if after.get(n) != "hold"]
        if rc != 0 or unheld:
            module.fail_json(msg=f"dpkg --set-selections ({rc}: {err.strip()}) left {', '.join(unheld)} unheld",
                             **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
