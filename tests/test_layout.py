"""The module table of docs/development.md is the package's map: it names every module, in its
room.

DESIGN.md makes the table the architecture's one description; a module added without a
row entry (or a row naming a module that is gone) makes the map lie to the next reader.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| (top|`(\w+)/`) \| (.*?) \|")


def table() -> dict[str, set[str]]:
    """``{subpackage ("" for top): module names}`` from docs/development.md's layout table."""
    rows: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "development.md").read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(2) or ""] = set(re.findall(r"`(\w+)`", m.group(3)))
    return rows


def test_the_readme_table_names_every_module_and_no_other():
    rows = table()
    package = ROOT / "heatmap3d"
    rooms = {""} | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert set(rows) == rooms
    for room, named in rows.items():
        modules = {p.stem for p in (package / room).glob("*.py")} - {"__init__", "__main__"}
        where = room or "top"
        assert named == modules, f"{where}: missing {modules - named}, extra {named - modules}"
