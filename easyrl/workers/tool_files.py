"""The files a multi-turn rollout reads (``worker.rollout.multi_turn.tools`` / ``env``): tools and their JSON schemas,
environment classes. Apart from the rollout (torch, the engine) so that `easyrl check` and the driver read them
without importing either."""

import enum
import functools
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Optional

from .reward.loader import import_user_file, short_repr


TOOLS_KEY = "worker.rollout.multi_turn.tools"
ENV_KEY = "worker.rollout.multi_turn.env"

ROW_ARGUMENT = "row"  # a tool with this parameter gets its trajectory's dataset row (not shown in the schema)
# a multi-turn rollout's per-sample counts (turns, tool calls, errors, ...) in its output's non-tensor batch, which
# `easyrl generate` / `easyrl eval` write into each row and sum
MULTI_TURN_COUNTS = "multi_turn_counts"


def takes_row(fn: Callable) -> bool:
    try:
        return ROW_ARGUMENT in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def tool_schema(fn: Callable, method: bool = False) -> dict:
    """The OpenAI-style JSON schema of a tool: its ``schema`` attribute, else read from its type hints and Google-style
    docstring the way transformers' chat templates read tools (without the ``row`` argument, which the rollout
    fills). ``method``: ``fn`` is a tool method of an environment class, read from the class (its first parameter,
    ``self``, is not shown either)."""
    schema = getattr(fn, "schema", None)
    if schema is not None:
        return schema
    from transformers.utils import get_json_schema

    signature = inspect.signature(fn)
    hidden = {ROW_ARGUMENT, *list(signature.parameters)[:1]} if method else {ROW_ARGUMENT}
    if hidden & set(signature.parameters):
        shown = functools.wraps(fn)(lambda **kwargs: None)
        shown.__signature__ = signature.replace(
            parameters=[p for name, p in signature.parameters.items() if name not in hidden]
        )
        shown.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k not in hidden}
        schema = get_json_schema(shown)
    else:
        schema = get_json_schema(fn)
    properties = schema["function"].get("parameters", {}).get("properties", {})
    for name, kind in enum_parameters(fn).items():
        if name in properties:  # transformers' reader calls an Enum an "object" and lists no values
            values = [member.value for member in kind]
            named = {str: "string", int: "integer", float: "number"}.get(type(values[0])) if values else None
            same = named is not None and all(type(value) is type(values[0]) for value in values)
            described = {key: value for key, value in properties[name].items() if key != "type"}
            properties[name] = {**described, **({"type": named} if same else {}), "enum": values}
    return schema


def enum_parameters(fn: Callable) -> dict[str, type]:
    """The parameters of ``fn`` typed with an Enum class (or an Optional one): the model writes a member's value, which
    the tool gets as the member (``enum_arguments``)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an unresolvable forward reference: the schema reader reports it
        return {}
    found = {}
    for name, hint in hints.items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        kinds = [
            k
            for k in (typing.get_args(hint) if union else (hint,))
            if isinstance(k, type) and issubclass(k, enum.Enum)
        ]
        if len(kinds) == 1:
            found[name] = kinds[0]
    return found


def enum_arguments(fn: Callable, arguments: dict) -> dict:
    """``arguments`` with the values of Enum-typed parameters turned into their members (a value no member has raises
    ValueError, which the model reads as the tool's error)."""
    kinds = enum_parameters(fn)
    return {
        name: kinds[name](value)
        if name in kinds and value is not None and not isinstance(value, kinds[name])
        else value
        for name, value in arguments.items()
    }


# ----------------------------------------------------------------------------------------------------------------------
# a call's arguments against the schema the model was shown
# ----------------------------------------------------------------------------------------------------------------------
class ToolArgumentError(ValueError):
    """A tool call's argument is not of the type its schema advertises, and no lossless reading makes it one."""


_JSON_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}
_INTEGER_TEXT = re.compile(r"\s*[+-]?\d+\s*")
_NUMBER_TEXT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")


def _json_kind(value: Any) -> str:
    """The JSON type name of a parsed argument value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return (
        "array" if isinstance(value, (list, tuple)) else "object" if isinstance(value, dict) else type(value).__name__
    )


def _is_of(value: Any, kind: str) -> bool:
    found = _json_kind(value)
    return found == kind or (kind == "number" and found == "integer")


_NO_READING = object()


def _read_as(value: Any, kind: str) -> Any:
    """``value`` read losslessly as JSON type ``kind``, or _NO_READING: a string that holds the literal of an integer,
    a number, a boolean, an array or an object; an integral float as an integer; a number as its text."""
    if isinstance(value, str):
        if kind == "integer" and _INTEGER_TEXT.fullmatch(value):
            return int(value)
        if kind == "number" and _NUMBER_TEXT.fullmatch(value) and math.isfinite(float(value)):
            return float(value)
        if kind == "boolean" and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if kind in ("array", "object"):
            try:
                parsed = json.loads(value)
            except ValueError:
                return _NO_READING
            return parsed if _is_of(parsed, kind) else _NO_READING
    elif kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    elif kind == "string" and _json_kind(value) in ("integer", "number"):
        return json.dumps(value)
    return _NO_READING


def _conform(value: Any, schema: Any, where: str, coerced: list[str]) -> Any:
    """``value`` as the JSON schema ``schema`` types it (recursing into arrays' items and objects' properties), with
    each lossless re-reading described in ``coerced``; raises ToolArgumentError for a value of another type. A schema
    without a ``type`` (an untyped parameter) takes anything."""
    if not isinstance(schema, dict) or "type" not in schema:
        return value
    kinds = [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
    if schema.get("nullable"):
        kinds.append("null")
    if not any(_is_of(value, kind) for kind in kinds):
        for kind in kinds:
            reading = _read_as(value, kind)
            if reading is not _NO_READING:
                coerced.append(f'"{where}" = {short_repr(value, 40)} read as {_JSON_TYPE_NAMES.get(kind, kind)}')
                value = reading
                break
        else:
            wanted = " or ".join(_JSON_TYPE_NAMES.get(kind, str(kind)) for kind in kinds)
            got = _JSON_TYPE_NAMES.get(_json_kind(value), _json_kind(value))
            shown = json.dumps(value, ensure_ascii=False, default=str)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise ToolArgumentError(f'argument "{where}" must be {wanted}; got {shown} ({got})')
    if isinstance(value, (list, tuple)):
        positions = schema.get("prefixItems") or []
        return [
            _conform(item, positions[i] if i < len(positions) else schema.get("items"), f"{where}[{i}]", coerced)
            for i, item in enumerate(value)
        ]
    if isinstance(value, dict):  # named properties, and the others' schema (a `dict[str, int]` hint's)
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        others = schema.get("additionalProperties")
        return {
            key: _conform(item, properties.get(key, others), f"{where}.{key}", coerced) for key, item in value.items()
        }
    return value


def _parameters_object(schema: Any) -> Optional[dict]:
    """The ``parameters`` object schema of a tool's JSON schema (None when it has none)."""
    function = schema.get("function", schema) if isinstance(schema, dict) else None
    parameters = function.get("parameters") if isinstance(function, dict) else None
    return parameters if isinstance(parameters, dict) else None


def _properties(parameters: Optional[dict]) -> dict:
    """name -> JSON schema of each argument a ``parameters`` object schema lists (none for None)."""
    properties = (parameters or {}).get("properties")
    return properties if isinstance(properties, dict) else {}


def _read_parameters(fn: Callable, method: bool) -> Optional[dict]:
    try:
        return _parameters_object(tool_schema(fn, method)) or {}
    except Exception:  # no schema to read (a library caller's undocumented function): nothing was advertised
        return None


_cached_parameters = functools.lru_cache(maxsize=1024)(_read_parameters)


def shown_parameters_object(fn: Callable) -> Optional[dict]:
    """The ``parameters`` object schema of the tool ``fn`` as the prompts advertise it (a tool environment's bound
    method: read from its class's function, as env_tool_schemas reads it); None when no schema can be read."""
    own = getattr(fn, "schema", None)
    if own is not None:
        return _parameters_object(own) or {}
    function = getattr(fn, "__func__", None)
    target, method = (function, True) if function is not None else (fn, False)
    try:
        return _cached_parameters(target, method)
    except TypeError:  # an unhashable callable
        return _read_parameters(target, method)


def _takes_any_keyword(fn: Callable) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True  # cannot tell: the call decides
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters)


def checked_arguments(fn: Callable, arguments: dict) -> tuple[dict, list[str]]:
    """A tool call's ``arguments`` against the parameter types of the schema the model was shown
    (``shown_parameters_object``): a value of another type is read as the advertised one where its text says the same
    (the string "2" as the integer 2, "false" as false, 2.0 as 2, a number as its text, a JSON array or object sent as
    a string) and described in the returned list; a value no reading fits raises ToolArgumentError, which the model gets as its error. Without this
    check a tool typed ``int`` would get "2" and compute "2" + "3" = "23". A call that leaves out an argument the
    schema requires, or names one it does not list (unless the function takes ``**kwargs``), raises
    ToolArgumentError too: the model malformed the call, the tool did not fail."""
    shown, coerced = shown_parameters_object(fn), []
    parameters = _properties(shown)
    if shown is not None:
        required = shown.get("required") if isinstance(shown.get("required"), list) else []
        missing = [name for name in required if name not in arguments]
        if missing:
            raise ToolArgumentError(f"missing required argument(s) {', '.join(map(json.dumps, missing))}")
        unknown = [name for name in arguments if name not in parameters]
        if unknown and not _takes_any_keyword(fn):
            takes = ", ".join(parameters) or "no arguments"
            raise ToolArgumentError(f"unknown argument(s) {', '.join(map(json.dumps, unknown))}; it takes: {takes}")
    checked = {
        name: _conform(value, parameters[name], name, coerced) if name in parameters else value
        for name, value in arguments.items()
    }
    return checked, coerced


def _named_schemas(functions: list[Callable], where: str, key: str, method: bool = False) -> dict[str, dict]:
    """name -> JSON schema of each tool, in the order of ``functions`` (the name the model calls it by is the
    schema's). Two tools of one name are refused: the model would be shown that name twice and one tool never, and
    pairing names with ``functions`` would bind a name to the wrong function."""
    schemas, owners = {}, {}
    for fn in functions:
        fn_name = getattr(fn, "__name__", repr(fn))
        if getattr(fn, "schema", None) is None and not (inspect.isfunction(fn) or inspect.ismethod(fn)):
            # a callable object or a functools.partial: the schema reader (transformers', as TRL's) takes functions
            kind = "a functools.partial" if isinstance(fn, functools.partial) else f"a {type(fn).__name__} object"
            raise ValueError(
                f"`{key}`: `{where}` lists {kind}, not a function, as a tool, and the JSON schema the model is shown "
                "is read from a function's type hints and docstring. Wrap it in a `def` with those (e.g. `def "
                "search(query: str) -> str:` with an `Args:` docstring, calling the object), or give it a `schema` "
                "attribute."
            )
        try:
            schema = tool_schema(fn, method)
        except Exception as err:  # transformers' DocstringParsingException, TypeHintParsingException
            if _takes_any_keyword(fn):  # no type hint makes **kwargs a schema
                raise ValueError(
                    f"`{key}`: no JSON schema for `{fn_name}` in `{where}`: it takes `**kwargs`, whose arguments no "
                    f"type hint or docstring can name. Give it a `schema` attribute (`{fn_name}.schema = "
                    '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {"type": '
                    '"object", "properties": {...}}}}`), or name its arguments.'
                ) from None
            raise ValueError(
                f"`{key}`: no JSON schema for `{fn_name}` in `{where}`: {str(err).rstrip('.')}. Give it type "
                "hints and a Google-style docstring with an `Args:` line per argument, or a `schema` attribute."
            ) from None
        name = _schema_name(schema)
        if name is None:
            raise ValueError(
                f"`{key}`: `{fn_name}.schema` in `{where}` is {short_repr(schema)}; it must be an OpenAI-style dict, "
                '{"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}, or leave '
                "it out to read the schema from the type hints and docstring."
            )
        if getattr(fn, "schema", None) is not None:
            _check_own_schema(fn, schema, f"`{key}`: `{fn_name}.schema` in `{where}`", method)
        if name in owners:
            first = owners[name]
            what = (
                f"lists `{fn_name}` twice"
                if first is fn
                else f"has two tools named {name!r}: `{getattr(first, '__name__', first)}` and `{fn_name}`"
            )
            raise ValueError(
                f"`{key}`: `{where}` {what}; the model would be shown {name!r} twice and could call only one of them. "
                "Give each tool its own name (a `schema` attribute's name is the one the model calls)."
            )
        schemas[name], owners[name] = schema, fn
    return schemas


def _check_own_schema(fn: Callable, schema: dict, where: str, method: bool) -> None:
    """A ``schema`` attribute against the function it describes: its ``parameters`` is an object schema, every property
    it advertises is a parameter of the function (unless it takes ``**kwargs``), and every parameter the function
    requires is advertised; else the model, calling as advertised, would get an error at every call."""
    function = schema.get("function", schema)
    parameters = function.get("parameters") if "parameters" in function else {"type": "object"}
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ValueError(
            f"{where}: `parameters` is {short_repr(parameters)}; it must be a JSON object schema, "
            '{"type": "object", "properties": {"<argument>": {"type": ...}}, "required": [...]}.'
        )
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise ValueError(
            f"{where}: `parameters.properties` is {short_repr(properties)}; it must map names to schemas."
        )
    try:
        signature = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a signature Python cannot read: the calls tell
        return
    signature = [p for p in signature[1 if method else 0 :] if p.name != ROW_ARGUMENT]
    named = {p.name for p in signature if p.kind not in (inspect.Parameter.VAR_POSITIONAL, p.VAR_KEYWORD)}
    unknown = [name for name in properties if name not in named]
    if unknown and not _takes_any_keyword(fn):
        raise ValueError(
            f"{where} advertises argument(s) {', '.join(unknown)}, which the function does not take (it takes "
            f"{', '.join(sorted(named)) or 'none'}); make the schema's `properties` the function's parameters."
        )
    required = [
        p.name
        for p in signature
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in properties
    ]
    if required:
        raise ValueError(
            f"{where} leaves out {', '.join(required)}, which the function requires: the model would never send it. "
            "Add it to the schema's `properties` and `required`, or give it a default."
        )


def _schema_name(schema: Any) -> Optional[str]:
    """The name a tool's JSON schema gives it: OpenAI's ``{"type": "function", "function": {"name": ...}}`` or the bare
    function object ``{"name": ...}``; None when the schema is not such a dict."""
    function = schema.get("function", schema) if isinstance(schema, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None


def load_tools(path: str) -> dict[str, Callable]:
    """name -> function of the ``TOOLS`` list of the user file ``path`` (``worker.rollout.multi_turn.tools``)."""
    module = import_user_file(path, TOOLS_KEY)
    listed = getattr(module, "TOOLS", None)
    if not isinstance(listed, (list, tuple)) or not listed or not all(callable(fn) for fn in listed):
        raise ValueError(f"`{TOOLS_KEY}`: `TOOLS` in `{path}` must be a non-empty list of functions.")
    return dict(zip(_named_schemas(list(listed), path, TOOLS_KEY), listed))


def tool_schemas(tools: Optional[str], env: Any = None) -> list[dict] | dict[str, list[dict]]:
    """The JSON schemas the chat template's ``tools=`` advertises in the prompts: the tools of the file ``tools``,
    then the tool methods of a tool environment ``env`` (TRL's environment_factory classes). With several
    environments (a mapping), one list per environment name: a row's prompt advertises its own environment's."""
    file_tools = load_tools(tools) if tools else {}
    schemas = [tool_schema(fn) for fn in file_tools.values()]
    by_name = {}
    for name, env_class in load_env_classes(env).items():
        methods = env_tool_schemas(env_class) if is_tool_env(env_class) else {}
        check_tool_names(file_tools, methods)
        by_name[name] = schemas + list(methods.values())
    return by_name if isinstance(env, Mapping) else by_name.get(None, schemas)


def check_tool_names(tools: dict, methods: dict) -> None:
    """A tool environment's method and a tool of `tools` may not share a name: the model could call only one."""
    both = sorted(set(tools) & set(methods))
    if both:
        raise ValueError(
            f"`{TOOLS_KEY}` and the tool methods of `{ENV_KEY}` both name {', '.join(both)}; the model could only call "
            "one of each name. Rename one, or leave the tools file out."
        )


@functools.cache  # one import of a file per process, as Python imports a module once
def load_env_class(spec: str) -> type:
    """The environment class of ``path.py:ClassName`` (``worker.rollout.multi_turn.env``): a stepped environment
    (``reset(row)`` and ``step(action_text)``) or a tool environment (``reset(**columns)`` and tool methods, the
    classes of TRL's ``environment_factory``; ``is_tool_env``)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not name.isidentifier():
        raise ValueError(f"`{ENV_KEY}` is {spec!r}; give it as path/to/file.py:ClassName.")
    module = import_user_file(path, ENV_KEY)
    cls = getattr(module, name, None)
    if not isinstance(cls, type) or not callable(getattr(cls, "reset", None)):
        raise ValueError(
            f"`{ENV_KEY}`: `{name}` in `{path}` must be a class with `reset(row)` and `step(action_text)`, or (TRL's "
            "environment_factory classes) `reset(**columns)` and public methods the model calls as tools."
        )
    if is_tool_env(cls) and not env_tool_methods(cls):
        raise ValueError(
            f"`{ENV_KEY}`: `{name}` in `{path}` has neither `step(action_text)` nor a public method for the model to "
            "call as a tool; give it one of the two."
        )
    required = required_init_parameters(cls)
    if required:
        raise ValueError(
            f"`{ENV_KEY}`: `{name}` in `{path}` needs {', '.join(required)} in `__init__`, but an environment is built "
            "with no arguments (one instance per trajectory); give them defaults, or read them from the row in `reset`."
        )
    return cls


def required_init_parameters(cls: type) -> list[str]:
    """The parameters of ``cls()`` that have no default (the class cannot be built with no arguments)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # a class whose signature Python cannot read: judged when it is built
        return []
    optional = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in parameters if p.default is inspect.Parameter.empty and p.kind not in optional]


def env_specs(env: Any) -> dict[Optional[str], str]:
    """``worker.rollout.multi_turn.env`` as name -> `path.py:Class`: {None: spec} for one environment, the mapping
    itself for several (TRL's dictionary environment_factory), {} for none."""
    if not env:
        return {}
    if isinstance(env, str):
        return {None: env}
    if isinstance(env, Mapping) and all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items()):
        return dict(env)
    raise ValueError(
        f"`{ENV_KEY}` is {env!r}; give path/to/file.py:ClassName, or a mapping of names to path/to/file.py:ClassName."
    )


def load_env_classes(env: Any) -> dict[Optional[str], type]:
    """name -> environment class of ``worker.rollout.multi_turn.env`` (see env_specs); several environments are tool
    environments, as TRL's dictionary holds."""
    classes = {name: load_env_class(spec) for name, spec in env_specs(env).items()}
    if isinstance(env, Mapping):
        stepped = [name for name, cls in classes.items() if not is_tool_env(cls)]
        if stepped:
            raise ValueError(
                f"`{ENV_KEY}.{stepped[0]}` ({env[stepped[0]]}) has `step`; several environments are tool environments "
                "(TRL's environment_factory classes: reset and tool methods), a stepped one is given alone."
            )
    return classes


def has_tool_env(env: Any) -> bool:
    """``worker.rollout.multi_turn.env`` names tool environments (their reset gets the row's columns)."""
    return any(is_tool_env(cls) for cls in load_env_classes(env).values())


# A tool environment's methods that are not tools (TRL's reserved names, and `close`, which easyrl calls on an instance
# it drops: Gymnasium's name for releasing what it holds); names starting with `_` are not tools either.
ENV_RESERVED_METHODS = ("reset", "get_reward", "close")


def is_tool_env(cls: type) -> bool:
    """True for a class without ``step``: its public methods are the model's tools and ``reset(**columns)`` sets it up
    (TRL's environment_factory contract); a class with ``step`` is stepped on each model turn's text."""
    return not callable(getattr(cls, "step", None))


def env_tool_methods(cls: type) -> list[str]:
    """The names of a tool environment's tool methods: its public functions but ``reset``, ``get_reward`` and
    ``close``."""
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ENV_RESERVED_METHODS
    ]


def env_tool_schemas(cls: type) -> dict[str, dict]:
    """name -> JSON schema of each tool method of a tool environment class."""
    methods = [getattr(cls, name) for name in env_tool_methods(cls)]
    return _named_schemas(methods, _class_label(cls), ENV_KEY, method=True)


def _class_label(cls: type) -> str:
    """A user's class as ``worker.rollout.multi_turn.env`` names it: path/to/file.py:ClassName."""
    try:
        return f"{inspect.getfile(cls)}:{cls.__qualname__}"
    except TypeError:  # a class without a source file
        return f"{cls.__module__}.{cls.__qualname__}"
