"""How one driver call on a worker group becomes one call per rank, and how the answers come back.

A worker method is tagged with ``@register(dispatch_mode=...)``; the worker group then grows a method of the same
name that splits the arguments over the ranks (dispatch), calls every rank, and joins what they return (collect).

Modes (registered by name, so a new layout is one ``register_dispatch_mode`` call):
- ONE_TO_ALL:            every rank gets the same arguments; the driver gets the list of all answers.
- ONE_TO_ALL_RANK_ZERO:  every rank gets the same arguments (collectives stay matched); the driver gets rank 0's.
- ALL_TO_ALL:            every argument is a list with one entry per rank; the driver gets the list of answers.
- DP_COMPUTE_PROTO:      every DataProto argument is padded to a multiple of the world size and split into equal
                         contiguous chunks, rank i gets chunk i; the answers are concatenated in rank order and the
                         padding rows are removed again.
- dp_compute_proto(mesh) the same over a data-parallel layout the workers declared with
                         ``Worker.register_dispatch_info`` (e.g. tensor-parallel rollout groups: every rank of a
                         group gets its group's chunk, one rank per group answers).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class _GroupView(Protocol):
    world_size: int

    def dispatch_info(self, mesh_name: str) -> list[tuple[int, int, bool]]: ...


# dispatch(group, args, kwargs) -> (args per rank, kwargs per rank, context handed to collect)
DispatchFn = Callable[[_GroupView, tuple, dict], tuple[list[tuple], list[dict], Any]]
# collect(group, outputs in rank order, context) -> what the driver receives
CollectFn = Callable[[_GroupView, list, Any], Any]


@dataclass(frozen=True)
class DispatchMode:
    dispatch: DispatchFn
    collect: CollectFn


@dataclass(frozen=True)
class MethodSpec:
    dispatch_mode: str
    blocking: bool


class Dispatch:
    ONE_TO_ALL = "one_to_all"
    ONE_TO_ALL_RANK_ZERO = "one_to_all_rank_zero"
    ALL_TO_ALL = "all_to_all"
    DP_COMPUTE_PROTO = "dp_compute_proto"

    @staticmethod
    def dp_compute_proto(mesh_name: str) -> str:
        """DP_COMPUTE_PROTO over the data-parallel layout named ``mesh_name`` (see module docstring)."""
        return f"{Dispatch.DP_COMPUTE_PROTO}@{mesh_name}"


_METHOD_SPEC_ATTR = "__easyrl_dispatch__"
_MODES: dict[str, DispatchMode] = {}


def register_dispatch_mode(name: str, dispatch: DispatchFn, collect: CollectFn) -> None:
    _MODES[name] = DispatchMode(dispatch, collect)


def get_dispatch_mode(name: str) -> tuple[DispatchMode, str | None]:
    """The mode registered as ``name`` and, for ``mode@mesh`` names, the mesh name."""
    base, _, mesh_name = name.partition("@")
    if base not in _MODES:
        raise ValueError(f"Unknown dispatch mode `{name}`; registered: {', '.join(sorted(_MODES))}.")
    return _MODES[base], mesh_name or None


def register(dispatch_mode: str = Dispatch.ONE_TO_ALL, blocking: bool = True) -> Callable:
    """Tag a worker method so that worker groups expose it with this dispatch mode.

    With ``blocking=False`` the group method returns a ``PendingResult`` whose ``get()`` collects the answers.
    """

    def decorator(fn: Callable) -> Callable:
        setattr(fn, _METHOD_SPEC_ATTR, MethodSpec(dispatch_mode, blocking))
        return fn

    return decorator


def get_method_spec(fn: Any) -> MethodSpec | None:
    return getattr(fn, _METHOD_SPEC_ATTR, None)


# ----------------------------------------------------------------------------------------------------------------------
# the modes
# ----------------------------------------------------------------------------------------------------------------------
def _one_to_all(group: _GroupView, args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict], Any]:
    return [args] * group.world_size, [kwargs] * group.world_size, None


def _collect_all(group: _GroupView, outputs: list, context: Any) -> list:
    return outputs


def _collect_rank_zero(group: _GroupView, outputs: list, context: Any) -> Any:
    return outputs[0]


def _all_to_all(group: _GroupView, args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict], Any]:
    world = group.world_size
    for i, value in enumerate([*args, *kwargs.values()]):
        if not isinstance(value, (list, tuple)) or len(value) != world:
            raise ValueError(f"ALL_TO_ALL argument {i} must be a list with one entry per rank ({world}).")
    per_rank_args = [tuple(a[r] for a in args) for r in range(world)]
    per_rank_kwargs = [{k: v[r] for k, v in kwargs.items()} for r in range(world)]
    return per_rank_args, per_rank_kwargs, None


@dataclass(frozen=True)
class Padding:
    """The rows a call's DataProto arguments were padded with (``rows``) to ``total``, a multiple of the chunks."""

    rows: int = 0
    total: int = 0


def _split_data_protos(args: tuple, kwargs: dict, chunks: int) -> tuple[list[tuple], list[dict], Padding]:
    """Pad every DataProto argument to a multiple of ``chunks`` and cut it into ``chunks`` equal parts."""
    from ..protocol import DataProto, pad_dataproto_to_divisor

    lengths = {len(v) for v in [*args, *kwargs.values()] if isinstance(v, DataProto)}
    if len(lengths) > 1:
        raise ValueError(f"DataProto arguments of one call must have the same length, got {sorted(lengths)}.")
    padding = Padding()

    def split(value: Any) -> list:
        nonlocal padding
        if not isinstance(value, DataProto):
            return [value] * chunks
        padded, pad_size = pad_dataproto_to_divisor(value, chunks)
        padding = Padding(pad_size, len(padded))
        return padded.chunk(chunks)

    split_args = [split(a) for a in args]
    split_kwargs = {k: split(v) for k, v in kwargs.items()}
    per_chunk_args = [tuple(a[c] for a in split_args) for c in range(chunks)]
    per_chunk_kwargs = [{k: v[c] for k, v in split_kwargs.items()} for c in range(chunks)]
    return per_chunk_args, per_chunk_kwargs, padding


def _join_data_protos(outputs: list, padding: Padding) -> Any:
    """Concatenate per-chunk answers in order and drop the padding rows; metric-only answers come from chunk 0 (the
    workers reduced them over ranks), the engine metrics of answers with rows are combined over the chunks.

    An answer may hold several rows per input row, adjacent (a rollout's n samples of each prompt): the padding rows'
    answers are then the last ``rows x n`` (the padding sits at the end of the last chunk), all of them dropped."""
    from ..protocol import DataProto, unpad_dataproto
    from ..utils.engine_metrics import reduce_rank_metrics

    first = outputs[0]
    if not isinstance(first, DataProto):
        return outputs
    if first.batch is None and not first.non_tensor_batch:
        return first  # e.g. update_actor: only meta_info["metrics"], already reduced over ranks by the worker
    joined = DataProto.concat(outputs)
    ranks = [out.meta_info["metrics"] for out in outputs if isinstance(out.meta_info.get("metrics"), dict)]
    if len(ranks) > 1:  # concat keeps chunk 0's meta_info: a generate call's engine metrics were rank 0's alone
        joined.meta_info["metrics"] = reduce_rank_metrics(ranks)
    if not padding.rows:
        return joined
    per_row, rest = divmod(len(joined), padding.total)
    if rest or not per_row:
        raise ValueError(
            f"The workers answered {len(joined)} rows for {padding.total} (padded) input rows, not a whole number of "
            "rows per input row: the padding rows cannot be told apart."
        )
    return unpad_dataproto(joined, padding.rows * per_row)


def _dp_compute_proto(group: _GroupView, args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict], Any]:
    return _split_data_protos(args, kwargs, group.world_size)


def _collect_dp_compute_proto(group: _GroupView, outputs: list, padding: Padding) -> Any:
    return _join_data_protos(outputs, padding)


def _dp_compute_proto_on_mesh(mesh_name: str) -> DispatchMode:
    def dispatch(group: _GroupView, args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict], Any]:
        info = group.dispatch_info(mesh_name)
        dp_size = info[0][1]
        chunk_args, chunk_kwargs, padding = _split_data_protos(args, kwargs, dp_size)
        return (
            [chunk_args[dp_rank] for dp_rank, _, _ in info],
            [chunk_kwargs[dp_rank] for dp_rank, _, _ in info],
            padding,
        )

    def collect(group: _GroupView, outputs: list, padding: Padding) -> Any:
        info = group.dispatch_info(mesh_name)
        answers = [(dp_rank, out) for (dp_rank, _, is_collect), out in zip(info, outputs) if is_collect]
        answers.sort(key=lambda pair: pair[0])
        return _join_data_protos([out for _, out in answers], padding)

    return DispatchMode(dispatch, collect)


def resolve_dispatch_mode(name: str) -> DispatchMode:
    mode, mesh_name = get_dispatch_mode(name)
    if mesh_name is None:
        return mode
    if name.partition("@")[0] != Dispatch.DP_COMPUTE_PROTO:
        raise ValueError(f"Only {Dispatch.DP_COMPUTE_PROTO} takes a mesh name, got `{name}`.")
    return _dp_compute_proto_on_mesh(mesh_name)


register_dispatch_mode(Dispatch.ONE_TO_ALL, _one_to_all, _collect_all)
register_dispatch_mode(Dispatch.ONE_TO_ALL_RANK_ZERO, _one_to_all, _collect_rank_zero)
register_dispatch_mode(Dispatch.ALL_TO_ALL, _all_to_all, _collect_all)
register_dispatch_mode(Dispatch.DP_COMPUTE_PROTO, _dp_compute_proto, _collect_dp_compute_proto)
