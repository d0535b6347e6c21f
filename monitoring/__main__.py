"""`python -m monitoring --write | --check`: generate deploy/grafana/dashboards/*.json from monitoring/, or
fail (exit 1, naming the files) when the committed JSON differs from what the source generates."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from monitoring.build import rendered

DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "dashboards"


def stale(folder: Path = DASHBOARD_DIR) -> list[str]:
    """The dashboard files that are missing, differ from the source's rendering, or are left over."""
    wanted = rendered()
    out = [
        name
        for name, text in wanted.items()
        if not (folder / name).is_file() or (folder / name).read_text(encoding="utf-8") != text
    ]
    out += sorted(p.name for p in folder.glob("*.json") if p.name not in wanted)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m monitoring", description="Generate the Grafana dashboards"
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"write the JSON into {DASHBOARD_DIR}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the committed JSON is stale")
    args = parser.parse_args(argv)
    if args.write:
        DASHBOARD_DIR.mkdir(parents=True, exist_ok=True)
        for name, text in rendered().items():
            (DASHBOARD_DIR / name).write_text(text, encoding="utf-8")
            print(DASHBOARD_DIR / name)
        for extra in sorted(p for p in DASHBOARD_DIR.glob("*.json") if p.name not in rendered()):
            extra.unlink()
            print(f"removed {extra}")
        return 0
    bad = stale()
    if bad:
        print(f"stale dashboards: {', '.join(bad)}; run `python -m monitoring --write`", file=sys.stderr)
        return 1
    print("dashboards up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
