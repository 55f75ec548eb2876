"""docs/config.md is generated from the config docstrings and must be current."""

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from easyrl.utils.config_docs import field_docstrings, iter_sections, render_config_docs


ROOT = Path(__file__).resolve().parent.parent


def test_every_config_field_has_a_docstring():
    missing = []
    for section, cls in iter_sections():
        docs = field_docstrings(cls)
        missing += [f"{section}.{f.name}".lstrip(".") for f in fields(cls) if not docs.get(f.name)]
    assert missing == []


def test_docs_mention_every_leaf_key():
    text = render_config_docs()
    assert "| `worker.rollout.n` | int | `1` |" in text
    assert "`worker.actor.model.lora.rank`" in text


def test_docs_config_md_is_current():
    result = subprocess.run([sys.executable, "scripts/gen_config_docs.py", "--check"], cwd=ROOT, capture_output=True)
    assert result.returncode == 0, result.stdout.decode() + " Run: python scripts/gen_config_docs.py"
