"""Access to the real command outputs kept in tests/fixtures/nvidia/public-captures.md.

The file holds numbered sections ('### 3.2 ...', '#### 3.20a ...'), each with one or more
fenced blocks of verbatim output. Some pastes include the shell prompt and the command;
`outputs()` splits a block at those prompt lines and returns the output lines untouched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
NVIDIA = FIXTURES / "nvidia"
H200 = NVIDIA / "h200-test-machine"
PUBLIC_CAPTURES = NVIDIA / "public-captures.md"

_HEADING = re.compile(r"^#{3,4} (?P<id>\d+\.\d+[a-z]?) (?P<title>.*)$")

# A shell prompt at the start of a line, followed by the command typed there:
#   "$ cmd", "# cmd", "user@host:~$ cmd", "(env) root@host:/dir$ cmd", "[user@host]~$ cmd",
#   "ca6b61b6-...:~# cmd" (hostname only). Output lines never start like this in these captures.
_PROMPT = re.compile(
    r"^(?:\([^)\s]*\) )?"  # optional virtualenv/conda tag
    r"(?:\[[^\]\s]+\][^\s$#]*|[\w.@-]+:[^\s$#]*)?"  # optional user@host:path or [user@host]path
    r"[$#](?: (?P<command>.*))?$"
)


@dataclass(frozen=True)
class Block:
    """One fenced block: its text exactly as stored (without the fences)."""

    text: str
    language: str


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    blocks: tuple[Block, ...]


def is_prompt(line: str) -> bool:
    """True for a shell prompt line (with or without a command after it)."""
    return _PROMPT.match(line) is not None


@cache
def sections() -> dict[str, Section]:
    """Every numbered section of public-captures.md with its fenced blocks, in file order."""
    found: dict[str, Section] = {}
    current: tuple[str, str] | None = None
    blocks: list[Block] = []
    fence: tuple[str, list[str]] | None = None

    def close() -> None:
        if current is not None:
            found[current[0]] = Section(current[0], current[1], tuple(blocks))

    for line in PUBLIC_CAPTURES.read_text(encoding="utf-8").split("\n"):
        if fence is not None:
            if line == "```":
                blocks.append(Block("\n".join(fence[1]) + "\n", fence[0]))
                fence = None
            else:
                fence[1].append(line)
            continue
        if line.startswith("```"):
            fence = (line[3:], [])
            continue
        heading = _HEADING.match(line)
        if heading:
            close()
            current, blocks = (heading["id"], heading["title"]), []
    close()
    return found


def block(section_id: str, index: int = 0) -> str:
    """The text of one fenced block, exactly as stored."""
    return sections()[section_id].blocks[index].text


def outputs(section_id: str, index: int = 0) -> list[tuple[str | None, str]]:
    """(command, output) pairs of a block, split at prompt lines; output lines are not changed.

    Text before the first prompt is paired with None; a trailing bare prompt gives an empty output.
    """
    pairs: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in block(section_id, index).splitlines():
        match = _PROMPT.match(line)
        if match:
            pairs.append(((match["command"] or "").strip(), []))
        else:
            pairs[-1][1].append(line)
    result = [(command, "".join(line + "\n" for line in lines)) for command, lines in pairs]
    return [(c, text) for c, text in result if c is not None or text.strip()]


def output(section_id: str, index: int = 0, command: str | None = None) -> str:
    """The output of one command in a block: the first one, or the one whose command contains `command`."""
    pairs = [(c, text) for c, text in outputs(section_id, index) if text.strip()]
    if command is not None:
        pairs = [(c, text) for c, text in pairs if c is not None and command in c]
    if not pairs:
        raise KeyError(f"section {section_id} block {index} has no output for command {command!r}")
    return pairs[0][1]


def paragraphs(text: str) -> list[str]:
    """Split an output at blank lines (for blocks that hold two outputs one after the other)."""
    return [p + "\n" for p in re.split(r"\n\s*\n", text.strip("\n")) if p.strip()]


def h200(name: str) -> str:
    """A capture from this project's H200 test machine, as stored."""
    return (H200 / name).read_text(encoding="utf-8")
