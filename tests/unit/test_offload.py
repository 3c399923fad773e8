"""A trainer's states parked in host memory between steps (``trainer/offload.py``): storages move whole, in place, so
flat buffers, tied weights and the optimizer's references survive; a parked and restored trainer takes the same steps.
On a CPU nothing moves unless asked to copy (which runs the re-pointing here); on CUDA the memory is given back."""

import pytest
import torch

from coati.distributed.trainer.offload import Residency, move_storages, resident, state_tensors
from coati.distributed.transport.wire_layout import flatten_parameters

CUDA = torch.device("cuda", 0)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    head = torch.nn.Linear(8, 11, bias=False)
    head.weight = model[0].weight  # tied, as an LM's embedding and head
    model.append(head)
    model.register_buffer("scale", torch.tensor(2.0))
    return model


def train(model, optimizer, steps, between=None):
    losses = []
    for i in range(steps):
        ids = torch.arange(i, i + 6, device=next(model.parameters()).device) % 11
        loss = model(ids).logsumexp(-1).mean() * model.scale
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if between is not None:
            between()
    return losses


def test_views_of_one_storage_move_as_one_and_keep_their_values():
    model = tiny_model()
    flatten_parameters(model)
    params = list(model.parameters())
    storages = {p.untyped_storage().data_ptr() for p in params}
    assert len(storages) == 1  # one flat buffer
    before = [p.detach().clone() for p in params]
    ids = [id(p) for p in params]
    moved = move_storages(state_tensors([model], None), torch.device("cpu"), copy=True)
    assert len(moved) == len(params) + 1  # the parameters and the buffer
    after = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(after) == 1 and after != storages  # a new buffer, still one
    assert [id(p) for p in model.parameters()] == ids  # the same Parameter objects
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)
    assert model[3].weight is model[0].weight


def test_nothing_moves_on_a_cpu_trainer_unless_asked_to_copy():
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, optimizer, 1)
    home = Residency(torch.device("cpu"), lambda: [model], lambda: optimizer)
    ptrs = [t.data_ptr() for t in state_tensors([model], optimizer)]
    parked = home.park()
    assert parked["bytes"] == 0 and parked["resident_bytes"] == 0 == parked["parked_bytes"]
    assert home.parked and home.ensure() is not None and not home.parked
    assert home.ensure() is None  # resident: nothing to do
    assert [t.data_ptr() for t in state_tensors([model], optimizer)] == ptrs


def test_the_optimizer_state_is_found_and_moved():
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train(model, optimizer, 1)
    states = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    found = {id(t) for t in state_tensors([model], optimizer)}
    assert states and all(id(t) in found for t in states)
    home = Residency(torch.device("cpu"), lambda: [model], lambda: optimizer)
    ptrs = [t.data_ptr() for t in states]
    assert home.park(copy=True)["bytes"] > 0
    assert all(t.data_ptr() != p for t, p in zip(states, ptrs, strict=True))


def parked_and_restored(device, copy_on_cpu):
    """Two equal trainers on ``device``: one trained straight, one parked and restored after every step."""
    straight, parked = tiny_model().to(device), tiny_model().to(device)
    flatten_parameters(straight)
    flatten_parameters(parked)
    opt_a = torch.optim.AdamW(straight.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(parked.parameters(), lr=1e-2)
    home = Residency(device, lambda: [parked], lambda: opt_b)
    stats = []

    def cycle():
        stats.append(home.park(copy_on_cpu))
        home.ensure()

    return train(straight, opt_a, 4), train(parked, opt_b, 4, between=cycle), stats, parked


def test_a_parked_and_restored_trainer_takes_the_same_steps():
    a, b, stats, _ = parked_and_restored(torch.device("cpu"), copy_on_cpu=True)
    assert a == b  # bitwise: the moves copy values, the steps are the same
    assert all(s["bytes"] > 0 for s in stats)


def test_resident_methods_move_parked_states_back_and_report_it_once():
    class Consumer:
        def __init__(self):
            self.model = tiny_model()
            self.residency = Residency(torch.device("cpu"), lambda: [self.model], lambda: None)

        @resident
        def step(self):
            return self.residency.reloaded({"loss": 1.0})

    c = Consumer()
    assert c.step() == {"loss": 1.0}  # never parked: no reload reported
    c.residency.park()
    first = c.step()
    assert first["time/trainer_reload"] >= 0 and not c.residency.parked
    assert c.step() == {"loss": 1.0}


def test_the_optimizer_scan_reaches_nested_stores_and_leaves_modules_alone():
    class Store:  # as ZeRO keeps its master weights: an object of the framework's, holding a dict of tensors
        __module__ = "colossalai.zero.low_level"

        def __init__(self, master):
            self.master = {0: master}
            self.model = torch.nn.Linear(2, 2)  # a module under the optimizer is not the optimizer's to move

    master = torch.ones(3)
    store = Store(master)
    found = state_tensors([], store)
    assert any(t is master for t in found)
    assert not any(t is store.model.weight for t in found)


@pytest.mark.gpu
def test_parking_gives_the_accelerator_memory_back_and_the_steps_stay_the_same():
    a, b, stats, model = parked_and_restored(CUDA, copy_on_cpu=False)
    torch.testing.assert_close(b, a, rtol=1e-6, atol=0)  # kernels may differ in summation order between buffers
    for s in stats:  # what moved is given back (the straight trainer beside it stays)
        assert s["bytes"] > 0 and s["resident_bytes"] - s["parked_bytes"] >= 0.95 * s["bytes"], s
    assert next(model.parameters()).device == CUDA
    big = torch.nn.Linear(4096, 4096).to(CUDA)
    opt = torch.optim.AdamW(big.parameters())
    big(torch.ones(1, 4096, device=CUDA)).sum().backward()
    opt.step()
    home = Residency(CUDA, lambda: [big], lambda: opt)
    held = torch.cuda.memory_allocated(CUDA)
    parked = home.park()
    assert parked["resident_bytes"] == held and parked["parked_bytes"] < 0.01 * held, parked
    assert next(big.parameters()).device.type == "cpu" and next(big.parameters()).is_pinned()
    home.ensure()
    assert torch.cuda.memory_allocated(CUDA) >= 0.99 * held
