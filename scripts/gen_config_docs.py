"""Generate docs/config.md from the docstrings of the PPOConfig dataclasses.

Usage: python scripts/gen_config_docs.py [--check]   (--check exits 1 when docs/config.md is stale)
"""

import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from easyrl.utils.config_docs import render_config_docs  # noqa: E402


def main() -> int:
    target = ROOT / "docs" / "config.md"
    text = render_config_docs()
    if "--check" in sys.argv:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is stale: run python scripts/gen_config_docs.py")
            return 1
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
