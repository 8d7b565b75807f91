"""Copies the JSON Schemas the SDK validates wire objects with into the package.

narad's schemas (`schema/` at the repository's root) are the contract; the
package ships a copy of the ones a reader needs (`defs.json`,
`envelopes.json`, and every authority, watch, hydrate and control type) in
`src/narad/schema/`, so that an installed SDK validates without the
repository.

    python scripts/sync_schema.py           # copy (and drop files no longer there)
    python scripts/sync_schema.py --check   # exit 1, naming each file that differs

CI runs `--check`: a schema changed without the package's copy fails it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parents[2] / "schema"
TARGET = HERE.parent / "src" / "narad" / "schema"
#: What a reader validates with: the shared definitions and the wire types.
SHARED = ("defs.json", "envelopes.json")
KINDS = ("events", "watch", "hydrate", "control")


def wanted(root: Path) -> set[Path]:
    """The schema files under `root` the package ships, relative to it."""
    files = {Path(name) for name in SHARED if (root / name).is_file()}
    for kind in KINDS:
        if (root / kind).is_dir():
            files |= {p.relative_to(root) for p in (root / kind).glob("*.json")}
    return files


def differences(source: Path, target: Path) -> list[str]:
    """Each file whose package copy is missing, stale or left over, with why."""
    found: list[str] = []
    expected = wanted(source)
    held = wanted(target)
    for rel in sorted(expected):
        copy = target / rel
        if rel not in held:
            found.append(f"{copy}: missing (copy of {source / rel})")
        elif copy.read_bytes() != (source / rel).read_bytes():
            found.append(f"{copy}: differs from {source / rel}")
    for rel in sorted(held - expected):
        found.append(f"{target / rel}: not in {source} any more")
    return found


def sync(source: Path, target: Path) -> int:
    """Makes `target` an exact copy of what the package ships of `source`; the files changed."""
    changed = 0
    expected = wanted(source)
    for rel in sorted(wanted(target) - expected):
        (target / rel).unlink()
        changed += 1
    for rel in sorted(expected):
        copy = target / rel
        if copy.is_file() and copy.read_bytes() == (source / rel).read_bytes():
            continue
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, copy)
        changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    """Runs the script: 0 when the copy is (now) in sync, 1 when `--check` found a difference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    parser.add_argument("--schema", type=Path, default=SOURCE, help="narad's schema/ directory")
    args = parser.parse_args(argv)
    source: Path = args.schema
    if not wanted(source):
        print(f"{source}: no schemas there", file=sys.stderr)
        return 2
    if args.check:
        found = differences(source, TARGET)
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("run: python clients/python/scripts/sync_schema.py", file=sys.stderr)
            return 1
        return 0
    changed = sync(source, TARGET)
    print(f"{TARGET}: {len(wanted(source))} schema files, {changed} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
