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
