"""The thread count of a weight sync on shared CPU cores: the engine loads with one thread, the actor keeps its own."""

import torch

from easyrl.workers.rollout.weight_sync import produced_with_threads, torch_threads


def test_buckets_are_produced_with_the_actors_threads_while_the_engine_loads_with_one():
    produced_with = []

    def buckets():
        for index in range(3):
            produced_with.append(torch.get_num_threads())  # the actor's all-gather / LoRA merge runs here
            yield [(f"layers.{index}.weight", torch.zeros(2))]

    saved = torch.get_num_threads()
    loaded_with = []
    with torch_threads(1):
        for bucket in produced_with_threads(buckets(), 2):
            loaded_with.append(torch.get_num_threads())
            assert bucket[0][1].tolist() == [0.0, 0.0]
    assert produced_with == [2, 2, 2]
    assert loaded_with == [1, 1, 1]
    assert torch.get_num_threads() == saved


def test_only_a_text_model_is_reloaded_on_one_thread_on_busy_cores(monkeypatch):
    """A vision-language engine reloaded on one thread and run on two computed log-probs 0.36-0.43 away from the
    actor's (the tiny Qwen2.5-VL, one worker, 2 busy cores), so it keeps its threads whatever the load."""
    from easyrl.workers.rollout import weight_sync

    monkeypatch.setattr(weight_sync, "cores_oversubscribed", lambda: True)
    assert weight_sync.reload_on_one_thread(multimodal=False)
    assert not weight_sync.reload_on_one_thread(multimodal=True)
    monkeypatch.setattr(weight_sync, "cores_oversubscribed", lambda: False)
    assert not weight_sync.reload_on_one_thread(multimodal=False)
