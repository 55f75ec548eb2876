"""How the engine's metrics of several generate calls combine: calls made one after another in a step (refill rounds,
a ReMax baseline, a sync before validation) and one call answered by several data-parallel ranks at once.

Metric names say how they combine: seconds (``_s``, ``_seconds``), amounts (bytes, tokens, responses), rates (an
amount over seconds), maxima (``/max``) and means over responses (``/mean``, ``clip_ratio``)."""

# rate -> (amount, seconds): a rate over several calls is their total amount over their total time
_CALL_RATES = {
    "rollout/gen_tokens_per_s": ("rollout/gen_tokens", "rollout/gen_seconds"),
    "rollout/weight_sync_gb_per_s": ("rollout/weight_sync_gb", "rollout/weight_sync_s"),
}
# means over a call's responses: weighted by each call's responses (a ReMax baseline call has n times fewer)
_PER_RESPONSE = ("rollout/response_length/mean", "rollout/response_length/clip_ratio")
_SECONDS = ("_s", "_seconds")
_AMOUNTS = ("_gb", "_bytes", "_buckets", "/gen_tokens", "/gen_responses")


def _with_rates(reduced: dict[str, float]) -> dict[str, float]:
    for rate, (amount, seconds) in _CALL_RATES.items():
        if rate in reduced and amount in reduced and seconds in reduced:
            reduced[rate] = reduced[amount] / max(reduced[seconds], 1e-9)
    return reduced


def _weighted(key: str, metrics: list[dict[str, float]]) -> float:
    pairs = [(m[key], m.get("rollout/gen_responses", 1.0)) for m in metrics if key in m]
    return float(sum(v * w for v, w in pairs) / max(sum(w for _, w in pairs), 1e-9))


def reduce_call_metrics(calls: list[dict[str, float]]) -> dict[str, float]:
    """The engine metrics of several generate calls as one: seconds, bytes, tokens and responses add up over calls,
    rates are total over total, maxima the largest, per-response means weighted by the responses; other means and
    counts per call average."""
    reduced = {}
    for key in sorted({key for call in calls for key in call}):
        values = [call[key] for call in calls if key in call]
        if key.endswith(_SECONDS + _AMOUNTS):
            reduced[key] = float(sum(values))
        elif key.endswith("/max"):
            reduced[key] = float(max(values))
        elif key in _PER_RESPONSE and all("rollout/gen_responses" in call for call in calls if key in call):
            reduced[key] = _weighted(key, calls)
        else:
            reduced[key] = float(sum(values) / len(values))
    return _with_rates(reduced)


def reduce_rank_metrics(ranks: list[dict[str, float]]) -> dict[str, float]:
    """The engine metrics of one call answered by several data-parallel ranks, each for its share of the prompts:
    the ranks ran at once, so the call's seconds are the slowest rank's and its rates the total amount over them;
    tokens, responses, bytes and counts (tool calls, errors) add up; maxima are the largest; means over responses
    are weighted by each rank's responses."""
    if len(ranks) == 1:
        return dict(ranks[0])
    reduced = {}
    for key in sorted({key for rank in ranks for key in rank}):
        values = [rank[key] for rank in ranks if key in rank]
        if key.endswith(_SECONDS) or key.endswith("/max"):
            reduced[key] = float(max(values))
        elif key.endswith(("/mean", "clip_ratio")):
            reduced[key] = _weighted(key, ranks)
        else:
            reduced[key] = float(sum(values))
    return _with_rates(reduced)
