"""Loading a PPOConfig: defaults <- YAML file (``config=path.yaml``) <- command-line dotted overrides
(``worker.rollout.n=8``), unknown and derived keys refused with a suggestion, then every derived value filled in one
place (``derive``)."""

import difflib
import os
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional, Union, get_args, get_origin

from ..paths import absolute_if_local, resolve_shipped_file
from .compat import (
    FOREIGN_KEY_NAMES,
    FOREIGN_SECTION_NAMES,
    LEGACY_KEYS,
    LOSS_AVG_MODE_ALIASES,
    LOSS_TYPE_ALIASES,
    rename_legacy,
)
from .schema import ConfigError, PPOConfig


# ----------------------------------------------------------------------------------------------------------------------
# the key tree
# ----------------------------------------------------------------------------------------------------------------------
def _field_types(cls: type = PPOConfig, prefix: str = "") -> dict[str, Any]:
    """Every valid dotted key of the tree -> its dataclass field (leaves and sections alike)."""
    out = {}
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        out[key] = f
        ftype = f.type if isinstance(f.type, type) else None
        if ftype is not None and is_dataclass(ftype):
            out.update(_field_types(ftype, key + "."))
    return out


FIELDS = _field_types()
# Dict-valued fields whose contents are free-form (not checked against the tree).
FREE_DICT_KEYS = {key for key, f in FIELDS.items() if f.type is dict or f.metadata.get("mapping")}
DERIVED_KEYS = {key for key, f in FIELDS.items() if f.metadata.get("derived")}


def derived_from(key: str) -> tuple[str, ...]:
    """The keys a derived key is computed from (its field's ``derived`` sources; ``.name`` is a key of its section)."""
    section = key.rpartition(".")[0]
    return tuple(f"{section}{name}" if name.startswith(".") else name for name in FIELDS[key].metadata["from"])


def valid_keys() -> list[str]:
    return sorted(key for key in FIELDS if key not in DERIVED_KEYS)


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _path_share(given: list[str], candidate: list[str]) -> float:
    """How much of the two sections' paths match: each part of the given path counts by its similarity to the
    nearest part of the candidate's (nothing below 0.75), over the longer path's length."""
    if not given or not candidate:
        return 0.0
    matched = 0.0
    for part in given:
        best = max(_similarity(part, other) for other in candidate)
        matched += best if best >= 0.75 else 0.0
    return matched / max(len(given), len(candidate))


def _one_slip(given: str, valid: str) -> bool:
    """`valid` is `given` with one character added, dropped or changed, or two neighbours swapped."""
    if abs(len(given) - len(valid)) > 1 or given == valid:
        return False
    if len(given) == len(valid):
        differ = [i for i, (a, b) in enumerate(zip(given, valid)) if a != b]
        first, last = differ[0], differ[-1]
        swapped = given[first] == valid[last] and given[last] == valid[first]
        return len(differ) == 1 or (len(differ) == 2 and last == first + 1 and swapped)
    shorter, longer = sorted((given, valid), key=len)
    return any(longer[:i] + longer[i + 1 :] == shorter for i in range(len(longer)))


def _suggest(key: str) -> str:
    """The hint naming the valid key nearest an unknown one (" Did you mean `KEY`?"), or "" when none is near.

    A name that verl or TRL gives a setting (compat.FOREIGN_KEY_NAMES) names its easyrl key outright, whatever near
    spelling the section the user wrote holds (worker.actor.kl_loss_type is algorithm.kl_penalty, not
    worker.actor.loss_type), unless the key is one slip of the keyboard from a valid one (worker.actor.optim.beta is
    worker.actor.optim.betas, not TRL's beta). Otherwise candidates are the keys whose last part is close to the
    given one's (difflib ratio >= 0.6); they rank by that closeness plus the share of the section path that matches
    (verl's actor_rollout_ref read as worker), then the shorter key, then schema order. So actor.optim.lr is nearest
    worker.actor.optim.lr, not worker.actor.model.lora.lr (the same last part in a section that matches less)."""
    parts = [FOREIGN_SECTION_NAMES.get(part, part) for part in key.split(".")]
    leaf, path = parts[-1], parts[:-1]
    foreign = next(
        (named for name, named in FOREIGN_KEY_NAMES.items() if key == name or key.endswith("." + name)), None
    )
    inside = next(  # a foreign section that is a dict of easyrl's: verl's rollout.val_kwargs.temperature
        (
            (named, ("." + key).split("." + name + ".", 1)[1])
            for name, named in FOREIGN_KEY_NAMES.items()
            if f".{name}." in "." + key and named[0] in FREE_DICT_KEYS
        ),
        None,
    )
    if foreign is None and inside is not None:
        (target, note), rest = inside
        return f" Did you mean `{target}.{rest}`? ({note})"
    if foreign is not None and any(_one_slip(key, valid) for valid in FIELDS if valid not in DERIVED_KEYS):
        foreign = None
    ranked = []
    for order, candidate in enumerate(k for k in FIELDS if k not in DERIVED_KEYS):
        candidate_parts = candidate.split(".")
        closeness = _similarity(leaf, candidate_parts[-1])
        meant = foreign is not None and (candidate == foreign[0] or candidate.endswith("." + foreign[0]))
        if meant:
            closeness = 1.0
        elif closeness < 0.6:
            continue
        score = closeness + _path_share(path, candidate_parts[:-1])
        ranked.append((not meant, -score, len(candidate_parts), order, candidate, meant))
    if not ranked:
        return ""
    *_, best, meant = min(ranked)
    return f" Did you mean `{best}`?" + (f" ({foreign[1]})" if meant and foreign else "")


def _check_keys(flat: dict[str, Any], source: str) -> None:
    """Refuse keys easyrl does not take, every one of them in one error (a verl command line with twenty foreign keys
    is corrected in one pass, not twenty)."""
    problems = [problem for key in flat if (problem := _key_problem(key, source))]
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} config keys are refused:\n" + "\n".join(f"  - {p}" for p in problems))


def _key_problem(key: str, source: str) -> str | None:
    """Why ``key`` cannot be set (with what to set instead), or None for a key easyrl takes."""
    # a field inside a derived dict (worker.rollout.multi_turn.chat_template_kwargs.enable_thinking) is derived too
    derived = next((k for k in (key, *_prefixes(key)) if k in DERIVED_KEYS), None)
    if derived is not None:
        sources = derived_from(derived)
        named = " and ".join(f"`{name}`" for name in sources)
        inside = "" if derived == key else f" is inside `{derived}`, which"
        return (
            f"`{key}` (from {source}){inside} is derived by easyrl from {named} and cannot be set; remove it and set "
            f"{'that' if len(sources) == 1 else 'those'} instead (`easyrl check` prints the value it gets)."
        )
    if key in FIELDS or any(key.startswith(free + ".") for free in FREE_DICT_KEYS):
        return None
    setting = next((p for p in _prefixes(key) if p in FIELDS and not _is_section(p)), None)
    if setting is not None and _kind(FIELDS[setting].type)[0] != "any":
        return (
            f"Unknown config key `{key}` (from {source}): `{setting}` is one setting "
            f"({_describe(FIELDS[setting].type)}), not a section of keys."
        )
    return f"Unknown config key `{key}` (from {source}).{_suggest(key)}"


def _is_section(key: str) -> bool:
    return key in FIELDS and _kind(FIELDS[key].type)[0] == "section"


def _prefixes(key: str) -> list[str]:
    """a.b.c -> [a.b, a], longest first."""
    parts = key.split(".")
    return [".".join(parts[:end]) for end in range(len(parts) - 1, 0, -1)]


# ----------------------------------------------------------------------------------------------------------------------
# the shape of a value: a list where a list goes, one value where one goes (omegaconf's own errors name its node types)
# ----------------------------------------------------------------------------------------------------------------------
def _unwrapped(tp: Any) -> tuple[Any, bool]:
    """A field type without its Optional: (the type, Any for a union of several; whether null is allowed)."""
    if get_origin(tp) is not Union:
        return tp, False
    args = [arg for arg in get_args(tp) if arg is not type(None)]
    return (args[0] if len(args) == 1 else Any), len(args) < len(get_args(tp))


def _kind(tp: Any) -> tuple[str, bool]:
    """A field type -> (section | list | mapping | value | any, whether null is allowed)."""
    tp, nullable = _unwrapped(tp)
    tp = get_origin(tp) or tp
    if tp is Any:
        return "any", True
    if isinstance(tp, type) and is_dataclass(tp):
        return "section", nullable
    if tp in (list, tuple):
        return "list", nullable
    if tp is dict:
        return "mapping", nullable
    return "value", nullable


VALUE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _describe(tp: Any) -> str:
    """What a field holds, in words: a list, a mapping, a string, an integer, a number, true or false."""
    kind, _ = _kind(tp)
    if kind in ("list", "mapping", "section"):
        return f"a {kind}"
    if get_origin(tp) is Union:
        tp = next(arg for arg in get_args(tp) if arg is not type(None))
    return VALUE_NAMES.get(tp, f"one {_type_name(tp)}")


def _default(key: str) -> Any:
    field_ = FIELDS[key]
    if field_.default is not MISSING:
        return field_.default
    if field_.default_factory is not MISSING:
        return field_.default_factory()
    return None


def _flow(value: Any, in_file: bool) -> str:
    """A value as written after `key=` (or `key: ` in a YAML file): [a,b] / [a, b], true, null."""
    if isinstance(value, (list, tuple)):
        return "[" + (", " if in_file else ",").join(_flow(item, in_file) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if value == "":
        return '""' if in_file else ""
    return str(value)


def _written(key: str, value: Any, in_file: bool) -> str:
    """How to write `key` = value where it came from: `key=value` on the command line, `leaf: value` in a file."""
    if not in_file:
        return f"`{key}={_flow(value, False)}`"
    section, _, leaf = key.rpartition(".")
    return f"`{leaf}: {_flow(value, True)}`" + (f" under `{section}`" if section else "")


DATA_FILE_KEYS = ("data.train_files", "data.val_files")


def _check_values(flat: dict[str, Any], source: str, in_file: bool) -> None:
    """Refuse a value whose shape its key cannot hold, naming the key and how to write it (omegaconf would say
    "AnyNode is not a ListConfig" or "Cannot convert 'ListConfig' to string"): a list where a list goes
    (`trainer.logger=[file]`), one value where one goes, the keys of a section rather than a value."""
    for key, value in flat.items():
        if key not in FIELDS:
            continue
        kind, nullable = _kind(FIELDS[key].type)
        where = f"`{key}` (from {source})"
        if kind == "any" or (value is None and (nullable or (kind == "section" and in_file))):
            continue
        if kind == "section":
            if isinstance(value, dict):
                continue
            first = next(k for k in FIELDS if k.startswith(key + ".") and k not in DERIVED_KEYS)
            raise ConfigError(
                f"{where} is a section of keys, not a value: set the keys inside it, e.g. "
                f"{_written(first, _default(first), in_file)}."
            )
        if value is None:
            none = ", or [] for none" if kind == "list" else ""
            raise ConfigError(
                f"{where} cannot be null: give {_describe(FIELDS[key].type)}, e.g. its default "
                f"{_written(key, _default(key), in_file)}{none}."
            )
        shape = "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else None
        if kind == "list" and not isinstance(value, list):
            given = shape or f"`{_flow(value, in_file)}`"
            raise ConfigError(f"{where} takes a list, not {given}: {_list_example(key, value, in_file)}.")
        if kind == "mapping" and not isinstance(value, dict):
            raise ConfigError(
                f"{where} takes a mapping, not {shape or f'`{_flow(value, in_file)}`'}: write it in braces, e.g. "
                f"{_written(key, '{name: value}', in_file)}."
            )
        if kind == "value" and shape is not None:
            if key in DATA_FILE_KEYS:
                raise ConfigError(
                    f"{where} takes one path, not {shape}: a data file (.jsonl/.json/.parquet/.csv), a folder of "
                    "data files, a folder saved by `datasets`, `name@split` or `builtin://NAME@split`. For several "
                    "files, put them in one folder and give the folder, e.g. "
                    f"{_written(key, 'path/to/folder', in_file)}: every data file in it is read, each file one data "
                    "source of the per-source metrics (when the file names say test or validation, the split is "
                    "named after them: give `path/to/folder@test`)."
                )
            raise ConfigError(f"{where} takes {_describe(FIELDS[key].type)}, not {shape}.")


def _list_example(key: str, value: Any, in_file: bool) -> str:
    """How to write a list for `key`: from the value given (`file` -> [file]), or the default ([0.9, 0.999]) where
    the list holds numbers (a pair, often) or the value is a mapping."""
    default = _default(key)
    if isinstance(value, dict) or (default and not all(isinstance(item, str) for item in default)):
        example = default or ["value"]
        return f"write it in brackets, e.g. {_written(key, example, in_file)}" + (" (its default)" if default else "")
    items = [item.strip() for item in value.split(",")] if isinstance(value, str) and "," in value else [value]
    text = f"write {_written(key, items, in_file)}"
    if default and len(items) == 1:
        several = default if value in default else [default[0], value]
        text += f" (or several: `{_flow(several, in_file)}`)"
    return text


# ----------------------------------------------------------------------------------------------------------------------
# reading YAML and overrides
# ----------------------------------------------------------------------------------------------------------------------
def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; leaves are non-dict values (free-form dicts stay whole)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat = {}
    for key, value in tree.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value and full not in FREE_DICT_KEYS:
            flat.update(_flatten(value, full))
        else:
            flat[full] = value
    return flat


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree


def _coerce_scientific(value: Any) -> Any:
    """YAML 1.1 reads `1e-6` (no dot) as a string; numbers written that way mean numbers."""
    if isinstance(value, str):
        try:
            if "e" in value.lower() and value.strip().lstrip("+-")[0].isdigit():
                return float(value)
        except (ValueError, IndexError):
            return value
    if isinstance(value, dict):
        return {k: _coerce_scientific(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_coerce_scientific(v) for v in value]
    return value


def _parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`a.b=1` strings -> flat dict, values parsed as YAML (so `[console,file]`, `null`, `1e-6` work)."""
    import yaml

    flat = {}
    for item in overrides:
        if item.startswith("--config"):  # argparse's spelling; the file of `--config x.yaml` follows as its own item
            raise ConfigError(f"`{item}`: a config file is given as config=FILE, without dashes (config=run.yaml).")
        if "=" not in item:
            as_file = f" A config file is given as config={item}." if item.lower().endswith((".yaml", ".yml")) else ""
            raise ConfigError(
                f"Command-line argument `{item}` is not of the form key=value (e.g. worker.rollout.n=8).{as_file}"
            )
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("+")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, dict) and _takes_text(key):  # `judge.score_pattern=Score: ([0-9]+)` means that text
            value = raw
        elif isinstance(value, dict):
            _refuse_unspaced_mapping(key, raw, value)
        flat[key] = _coerce_scientific(value)
    return flat


def _refuse_unspaced_mapping(key: str, raw: str, value: dict) -> None:
    """`{temperature:1.0,n:2}` reads in YAML as the keys 'temperature:1.0' and 'n:2' without values: say so."""
    glued = [str(name) for name, item in value.items() if item is None and ":" in str(name)]
    if glued:
        name, _, given = glued[0].partition(":")
        raise ConfigError(
            f"`{key}={raw}`: `{glued[0]}` holds a colon: in YAML a mapping needs a space after it ({{{name}: "
            f"{given}}}, not {{{glued[0]}}}); or set one key at a time ({key}.{name}={given})."
        )


def _takes_text(key: str) -> bool:
    """Whether the field `key` holds a string (null allowed): YAML reads `a: b` on the command line as a mapping."""
    return key in FIELDS and _unwrapped(FIELDS[key].type)[0] is str


class _RepeatedKey(ValueError):
    pass


def _unique_key_loader():
    """A YAML safe loader that refuses a key given twice in one mapping: YAML keeps the second silently, so a config
    with two `worker:` sections (a block pasted below another) would lose every key of the first."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` keys may be overridden by the mapping's own: that is what merging means
                key, line = key_node.value, key_node.start_mark.line + 1
                if key in seen:
                    dropped = (
                        "drop every key of the first. Merge them into one."
                        if isinstance(value_node, yaml.MappingNode)
                        else "drop the first value. Keep the one you mean."
                    )
                    raise _RepeatedKey(
                        f"`{key}` is given twice in one section (lines {seen[key]} and {line}); YAML would keep only "
                        f"the second and {dropped}"
                    )
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return Loader


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml

    file = Path(path).expanduser()
    if file.is_dir():
        found = sorted(child.name for child in file.iterdir() if child.suffix.lower() in (".yaml", ".yml"))
        if found:
            listed = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
            hint = f"It holds {listed}: give one of them, e.g. config={file / found[0]}."
        else:
            hint = "Give the path of a YAML file, e.g. config=path/to/config.yaml."
        raise ConfigError(
            f"Config file `{path}` (given as config=...) is a directory; config= takes one YAML file. {hint}"
        )
    if not file.is_file():
        raise ConfigError(f"Config file `{path}` (given as config=...) does not exist.")
    try:
        data = yaml.load(file.read_text(), Loader=_unique_key_loader()) or {}
    except _RepeatedKey as err:
        raise ConfigError(f"Config file `{path}`: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"Config file `{path}` is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"Config file `{path}` must hold a mapping of sections (data, worker, ...).")
    return _coerce_scientific(data)


def _type_name(tp: Any) -> str:
    """A field's type as a user reads it: `int`, `int or null` (not `Optional`)."""
    inner, nullable = _unwrapped(tp)
    name = getattr(inner, "__name__", str(inner)).replace("typing.", "")
    return f"{name} or null" if nullable else name


def _split_args(args: Optional[list[str]]) -> tuple[Optional[str], list[str]]:
    """`config=FILE` and the key=value overrides."""
    config_file, overrides = None, []
    for arg in args or []:
        if arg.startswith("config="):
            if config_file is not None:
                # one file, then key=value overrides: a second file silently replacing the first would drop its keys
                raise ConfigError(
                    f"config= is given twice ({config_file} and {arg.split('=', 1)[1]}); easyrl reads one config file, "
                    "then key=value overrides. Merge the files into one, or give the second file's keys as "
                    "key=value arguments."
                )
            config_file = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return config_file, overrides


def with_spellings_given(message: str, args: Optional[list[str]]) -> str:
    """An error `message` that names a key the config gave in an older EasyR1 spelling (LEGACY_KEYS), with that
    spelling added, so the user finds the line to change; the message as it is when the arguments cannot be read."""
    try:
        config_file, overrides = _split_args(args)
        given = [key.split("=", 1)[0].strip().lstrip("+") for key in overrides]
        if config_file:
            given += list(_flatten(_load_yaml(config_file)))
    except ConfigError:
        return message
    named = {LEGACY_KEYS[key]: key for key in given if key in LEGACY_KEYS and f"`{LEGACY_KEYS[key]}`" in message}
    if not named:
        return message
    spellings = "; ".join(f"`{new}` is given in the config as `{old}`" for new, old in named.items())
    return f"{message} ({spellings}, EasyR1's older name)"


def read_config(args: Optional[list[str]] = None) -> PPOConfig:
    """The merged config (derived values filled, not validated)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_file, overrides = _split_args(args)
    layers = []
    if config_file:
        flat = rename_legacy(_flatten(_load_yaml(config_file)))
        _check_keys(flat, f"config file {config_file}")
        _check_values(flat, f"config file {config_file}", in_file=True)
        # a section left empty in the file (`trainer:` with all its keys commented out) sets nothing
        flat = {key: value for key, value in flat.items() if not (value is None and _is_section(key))}
        layers.append(("config file " + config_file, _unflatten(flat)))
    if overrides:
        flat = rename_legacy(_parse_overrides(overrides))
        _check_keys(flat, "the command line")
        _check_values(flat, "the command line", in_file=False)
        layers.append(("the command line", _unflatten(flat)))

    merged = OmegaConf.structured(PPOConfig)
    for source, layer in layers:
        try:
            merged = OmegaConf.merge(merged, OmegaConf.create(layer))
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or "?"
            expected = FIELDS.get(key)
            hint = f" Expected {_type_name(expected.type)}." if expected is not None else ""
            message = str(err.msg).splitlines()[0].rstrip(".")
            raise ConfigError(f"Bad value for `{key}` (from {source}): {message}.{hint}") from None
    try:  # interpolations (${oc.env:VAR}, ${data.seed}) resolve here
        config: PPOConfig = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        message = str(getattr(err, "msg", err)).splitlines()[0].rstrip(".")
        raise ConfigError(f"Bad value for `{key}`: {message}.") from None
    derive(config)
    return config


def load_config(args: Optional[list[str]] = None, validate: bool = True) -> PPOConfig:
    """Build a PPOConfig from `config=FILE` and `key=value` arguments (defaults <- file <- overrides)."""
    config = read_config(args)
    if validate:
        from .validate import validate_config

        validate_config(config)
    return config


# ----------------------------------------------------------------------------------------------------------------------
# derived values
# ----------------------------------------------------------------------------------------------------------------------
def derive(config: PPOConfig) -> None:
    """Fill every derived value; the one place where one section's values are copied into another's."""
    worker = config.worker
    actor, rollout, ref, critic = worker.actor, worker.rollout, worker.ref, worker.critic
    rollout.prompt_length = config.data.max_prompt_length
    rollout.response_length = actor.response_length = critic.response_length = config.data.max_response_length
    rollout.max_pixels = config.data.max_pixels
    rollout.trust_remote_code = actor.model.trust_remote_code
    if rollout.max_model_len is None:
        rollout.max_model_len = config.data.max_prompt_length + config.data.max_response_length

    actor.loss_avg_mode = LOSS_AVG_MODE_ALIASES.get(actor.loss_avg_mode, actor.loss_avg_mode)
    critic.loss_avg_mode = LOSS_AVG_MODE_ALIASES.get(critic.loss_avg_mode, critic.loss_avg_mode)
    actor.loss_type = LOSS_TYPE_ALIASES.get(actor.loss_type, actor.loss_type)
    actor.disable_kl = config.algorithm.disable_kl
    actor.use_kl_loss = config.algorithm.use_kl_loss
    actor.kl_penalty = config.algorithm.kl_penalty
    actor.kl_coef = config.algorithm.kl_coef

    for model in (actor.model, critic.model):
        model.model_path = absolute_if_local(model.model_path)
        model.tokenizer_path = absolute_if_local(model.tokenizer_path)
    if actor.model.tokenizer_path is None:
        actor.model.tokenizer_path = actor.model.model_path
    if critic.model.model_path is None:
        critic.model.model_path = actor.model.model_path
    if critic.model.tokenizer_path is None:
        critic.model.tokenizer_path = actor.model.tokenizer_path

    if ref.micro_batch_size_per_device_for_experience == -1:
        ref.micro_batch_size_per_device_for_experience = actor.micro_batch_size_per_device_for_experience
    ref.padding_free = actor.padding_free
    ref.dynamic_batching = actor.dynamic_batching
    ref.ulysses_size = actor.ulysses_size
    ref.use_torch_compile = actor.use_torch_compile
    ref.use_fused_kernels = actor.model.use_fused_kernels
    ref.shared_prefix = actor.shared_prefix

    world_size = max(config.world_size, 1)
    # the ranks of one Ulysses group share their samples (each holds a slice of every sequence), so a step's samples
    # split over the data-parallel groups, as in EasyR1: global x n / (world / ulysses_size) per rank
    actor.global_batch_size_per_device = actor.global_batch_size * rollout.n // data_parallel_size(actor, world_size)
    critic.global_batch_size_per_device = (
        critic.global_batch_size * rollout.n // data_parallel_size(critic, world_size)
    )

    trainer = config.trainer
    # `trainer.save_checkpoint_path=` unsets the key, as `key=` does elsewhere: the default folder, not the cwd
    if not trainer.save_checkpoint_path:
        trainer.save_checkpoint_path = os.path.join("checkpoints", trainer.project_name, trainer.experiment_name)
    trainer.save_checkpoint_path = os.path.abspath(trainer.save_checkpoint_path)
    reward = worker.reward
    reward.reward_function = resolve_shipped_file(reward.reward_function, "reward_function")
    config.data.format_prompt = resolve_shipped_file(config.data.format_prompt, "format_prompt")
    multi_turn = rollout.multi_turn
    multi_turn.tools = resolve_shipped_file(multi_turn.tools, "tools")
    env_key = "worker.rollout.multi_turn.env"
    if isinstance(multi_turn.env, str):
        multi_turn.env = resolve_shipped_file(multi_turn.env, "tools", env_key)
    elif multi_turn.env:  # TRL's dictionary of environments: name -> path.py:ClassName
        multi_turn.env = {
            name: resolve_shipped_file(spec, "tools", f"{env_key}.{name}") for name, spec in multi_turn.env.items()
        }
    for key in ("format_prompt", "override_chat_template", "image_dir"):
        setattr(config.data, key, absolute_if_local(getattr(config.data, key)))
    rollout.multi_turn.chat_template = config.data.override_chat_template
    rollout.multi_turn.chat_template_kwargs = dict(config.data.apply_chat_template_kwargs)


# ----------------------------------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------------------------------
def config_to_yaml(config: PPOConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(config))


def config_to_dict(config: PPOConfig) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(config))


def data_parallel_size(role_config, world_size: int) -> int:
    """How many data-parallel groups a role's samples split over: the workers, over ``ulysses_size`` (a size that
    does not divide the workers counts as 1 here; validation refuses it, naming the key)."""
    size = max(role_config.ulysses_size, 1)
    return world_size // size if world_size % size == 0 else world_size
