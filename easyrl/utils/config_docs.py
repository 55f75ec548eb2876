"""Field documentation of the PPOConfig tree, read from the docstrings under each dataclass field."""

import ast
import inspect
from dataclasses import MISSING, fields, is_dataclass

from ..config.compat import EASYR1_DIFFERENCES
from ..config.schema import PPOConfig
from ..config.validate import RANGES, config_value


def field_docstrings(cls: type) -> dict[str, str]:
    """{field name: the string literal written right under the field} for one dataclass, its bases' fields
    included (a subclass's own docstring wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if is_dataclass(klass) and klass is not object:
            docs.update(_own_field_docstrings(klass))
    return docs


def _own_field_docstrings(cls: type) -> dict[str, str]:
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _default(f) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        return ""
    return _shown(value)


def _shown(value) -> str:
    if is_dataclass(value):
        return ""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def _type(f) -> str:
    if f.metadata.get("mapping"):  # a value, or a mapping of free keys to values
        return "str, mapping or null"
    args = getattr(f.type, "__args__", None)
    if args and type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return f"{getattr(inner, '__name__', str(inner))} or null"
    return getattr(f.type, "__name__", str(f.type)).replace("typing.", "")


def iter_sections(cls: type = PPOConfig, prefix: str = ""):
    """Yield (dotted section name, dataclass) for every section of the tree, depth first."""
    yield prefix, cls
    for f in fields(cls):
        if isinstance(f.type, type) and is_dataclass(f.type):
            yield from iter_sections(f.type, f"{prefix}.{f.name}" if prefix else f.name)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_config_docs() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the docstrings in `easyrl/config/schema.py` and the differences in `easyrl/config/compat.py`",
        "by `python scripts/gen_config_docs.py`; do not edit.",
        "",
        "Values are resolved as defaults <- `config=FILE.yaml` <- `key=value` command-line overrides.",
        "`easyrl check` prints the resolved config and the run plan (roles, batches, steps, what is skipped and why, validation and checkpoints).",
        "",
    ]
    derived = []
    # a derived key's default is what it is copied from, by default: the value `derive` gives the defaults
    from ..config.load import derive

    resolved = PPOConfig()
    derive(resolved)
    for section, cls in iter_sections():
        if not section:
            continue
        leaves = [f for f in fields(cls) if not (isinstance(f.type, type) and is_dataclass(f.type))]
        if not leaves:
            continue
        docs = field_docstrings(cls)
        lines += [f"## `{section}`", "", "| key | type | default | description |", "|---|---|---|---|"]
        for f in leaves:
            doc = docs.get(f.name, "").replace("|", "\\|")
            if f"{section}.{f.name}" in RANGES:  # the range `easyrl check` holds the key to
                doc += f" Allowed: {RANGES[f'{section}.{f.name}']}."
            default = _default(f)
            if f.metadata.get("derived"):
                default = _shown(config_value(resolved, f"{section}.{f.name}"))
            row = f"| `{section}.{f.name}` | {_type(f)} | `{default}` | {doc} |"
            (derived if f.metadata.get("derived") else lines).append(row)
        lines.append("")
    lines += [
        "## Derived values",
        "",
        "Filled by easyrl from the keys above; setting one is an error. `easyrl check` prints their values.",
        "",
        "| key | type | default | description |",
        "|---|---|---|---|",
        *derived,
        "",
        "## Where easyrl differs from EasyR1",
        "",
        "A config written for EasyR1 loads unchanged. These keys mean something else in easyrl, for the reason",
        "given; where a difference changes a particular run (e.g. enforce_eager on a machine without CUDA), its run plan",
        "says so in a note.",
        "",
        "| key | difference and why |",
        "|---|---|",
        *(f"| `{key}` | {_cell(why)} |" for key, why in EASYR1_DIFFERENCES.items()),
        "",
    ]
    return "\n".join(lines)
