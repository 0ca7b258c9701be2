"""Load balancing for the MoE layer: the Switch auxiliary loss and DeepSeek-V3's bias update.

In one process: the loss against plain loops written from its definition, its gradient
against finite differences, and both remedies shown evening out a skewed router. On real
ranks (experts split by ``apply_expert_parallel``): the per-rank losses and router gradients
add up to the one-process ones on all tokens, and every rank's bias update is the
one-process update.
"""
import pytest
import torch
import torch.distributed as dist

from parlab.expert_parallel import apply_expert_parallel
from parlab.launch import run
from parlab.models import (MoE, MoEConfig, assignment_counts, load_balancing_loss, load_ratio,
                           update_router_bias)

D = 8


def _skewed(config, boost=0.4, seed=0):
    """With positive inputs (``torch.rand``), a boosted router row takes most choices."""
    moe = MoE(config, seed=seed)
    with torch.no_grad():
        moe.router.gate.weight[0] += boost
    return moe


def _chosen_load(moe):
    return assignment_counts(moe.last.routing.experts, moe.config.n_experts)


def _loss_by_loop(experts, probs, n_experts, alpha):
    """alpha N sum_i f_i P_i, f_i and P_i counted and averaged token by token."""
    experts, probs = experts.tolist(), probs.tolist()
    tokens, k = len(experts), len(experts[0])
    f = [sum(1 for t in range(tokens) for j in range(k) if experts[t][j] == i) / (tokens * k)
         for i in range(n_experts)]
    P = [sum(probs[t][i] for t in range(tokens)) / tokens for i in range(n_experts)]
    return alpha * n_experts * sum(fi * pi for fi, pi in zip(f, P)), f, P


@pytest.mark.parametrize("config", [
    MoEConfig(D, 16, 4, top_k=1, router="switch", capacity_factor=0.5),
    MoEConfig(D, 16, 4, top_k=2, capacity_factor=1.0),
    MoEConfig(D, 16, 6, top_k=2, router="deepseek"),
], ids=["switch-top1", "topk-top2", "deepseek-top2"])
def test_moe_balancing_loss_equals_the_definition(config):
    moe = _skewed(config)
    torch.manual_seed(2)
    moe(torch.rand(24, D))
    routing = moe.last.routing
    got = load_balancing_loss(routing, config.n_experts, alpha=0.3)
    want, f, P = _loss_by_loop(routing.experts, routing.probs, config.n_experts, 0.3)
    assert got.loss.item() == pytest.approx(want, rel=1e-6)
    assert got.f.tolist() == pytest.approx(f, rel=1e-6)
    assert got.P.tolist() == pytest.approx(P, rel=1e-6)
    assert got.tokens == 24
    if config.capacity_factor is not None:  # f counts the choices, kept or dropped
        assert moe.last.dropped > 0 and sum(f) == pytest.approx(1.0)


def test_moe_balancing_loss_gradient_reaches_the_router():
    """The router's gradient, against central differences of the loss (double precision, the
    choices, hence f, unchanged by so small a step); the experts get none."""
    moe = _skewed(MoEConfig(D, 16, 4, top_k=2)).double()
    torch.manual_seed(3)
    x = torch.rand(16, D, dtype=torch.float64)
    moe(x)
    load_balancing_loss(moe.last.routing, 4, alpha=1.0).loss.backward()
    weight = moe.router.gate.weight
    assert weight.grad.abs().max().item() > 1e-4
    assert all(p.grad is None for p in moe.experts.parameters())
    eps = 1e-6
    for i, j in [(0, 0), (1, 3), (3, 7)]:
        values = []
        for sign in (1, -1):
            with torch.no_grad():
                weight[i, j] += sign * eps
                values.append(load_balancing_loss(moe.router(x), 4, alpha=1.0).loss.item())
                weight[i, j] -= sign * eps
        assert weight.grad[i, j].item() == pytest.approx((values[0] - values[1]) / (2 * eps),
                                                         rel=1e-5, abs=1e-9)


def _train(config, alpha, steps=30, lr=0.1):
    """``steps`` of SGD on a regression loss (+ the auxiliary loss); the final chosen load."""
    moe = _skewed(config)
    torch.manual_seed(4)
    x, target = torch.rand(64, D), torch.randn(64, D)
    opt = torch.optim.SGD(moe.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        task = ((moe(x) - target) ** 2).mean()
        aux = load_balancing_loss(moe.last.routing, config.n_experts, alpha)
        (task + aux.loss).backward()
        opt.step()
    moe(x)
    return load_ratio(_chosen_load(moe))


@pytest.mark.parametrize("config, worst", [
    (MoEConfig(D, 16, 4, top_k=1, router="switch"), 4.0),
    (MoEConfig(D, 16, 4, top_k=2), 2.0),
], ids=["switch-top1", "topk-top2"])
def test_moe_balancing_loss_evens_the_load(config, worst):
    """max/mean load after 30 steps: ``worst`` (one expert in every token's choices) without
    the loss, close to 1 with it (a strong alpha, so that 30 steps are enough to see it)."""
    without, with_aux = _train(config, alpha=0.0), _train(config, alpha=1.0)
    assert without >= 0.95 * worst
    assert with_aux <= 1.3 < without


def test_moe_router_bias_update_evens_the_load():
    moe = _skewed(MoEConfig(D, 16, 4, top_k=2, router="deepseek"))
    torch.manual_seed(5)
    x = torch.rand(64, D)
    moe(x)
    before = load_ratio(_chosen_load(moe))
    for _ in range(30):
        moe(x)
        update_router_bias(moe, gamma=0.01)
    moe(x)
    after = load_ratio(_chosen_load(moe))
    assert before == 2.0 and after <= 1.3
    assert moe.router.bias[0].item() < 0 < moe.router.bias[1:].max().item()


@pytest.mark.parametrize("experts, load, change", [
    ([[0, 1], [0, 2], [0, 3], [2, 3]], [3, 1, 2, 2], [-1, 1, 0, 0]),   # mean 2: equal keeps
    ([[0, 1], [0, 2], [0, 1]], [3, 2, 1, 0], [-1, -1, 1, 1]),          # mean 1.5
])
def test_expert_bias_update_follows_the_sign_rule(experts, load, change):
    moe = MoE(MoEConfig(D, 16, 4, top_k=2, router="deepseek"))
    moe(torch.randn(len(experts), D))
    routing = moe.last.routing._replace(experts=torch.tensor(experts))
    moe.last = moe.last._replace(routing=routing)
    start = torch.tensor([0.5, 0.0, 0.0, -0.5])
    with torch.no_grad():
        moe.router.bias.copy_(start)
    update = update_router_bias(moe, gamma=0.25)
    assert update.load.tolist() == load
    assert update.change.tolist() == [0.25 * c for c in change]
    assert torch.equal(moe.router.bias, start + 0.25 * torch.tensor(change, dtype=torch.float32))


# --- on real ranks -----------------------------------------------------------------------

TOKENS, ALPHA, GAMMA, BIAS_STEPS = 16, 1.0, 0.01, 3
#: The loss cases; the last one is also the router whose bias is updated.
CASES = [("switch-top1", MoEConfig(D, 16, 4, top_k=1, router="switch")),
         ("topk-top2-drop", MoEConfig(D, 16, 4, top_k=2, capacity_factor=1.0)),
         ("deepseek-top2", MoEConfig(D, 16, 4, top_k=2, router="deepseek"))]


def _tokens(n):
    torch.manual_seed(6)
    return torch.rand(BIAS_STEPS, n * TOKENS, D)


def _balance_rank():
    """This rank's loss share, f, P and router gradient for each case, then its bias after
    each of a few forward + update steps; experts split over the ranks, statistics over all."""
    n, r, world = dist.get_world_size(), dist.get_rank(), dist.group.WORLD
    x = _tokens(n)[:, r * TOKENS:(r + 1) * TOKENS]
    out = {}
    for name, config in CASES:
        moe = apply_expert_parallel(_skewed(config))
        moe(x[0])
        aux = load_balancing_loss(moe.last.routing, config.n_experts, ALPHA, group=world)
        grad, = torch.autograd.grad(aux.loss, moe.router.gate.weight)
        out[name] = (aux.loss.item(), aux.f, aux.P, aux.tokens, grad)
    biases = []  # moe is now the last case's layer: the DeepSeek router
    for step in range(BIAS_STEPS):
        moe(x[step])
        update_router_bias(moe, GAMMA, group=world)
        biases.append(moe.router.bias.clone())
    return out, biases


def _reference(n):
    """The same on all tokens in one process (capacity counted per rank's run of tokens)."""
    x = _tokens(n)
    out = {}
    for name, config in CASES:
        moe = _skewed(config)
        moe(x[0], groups=n)
        aux = load_balancing_loss(moe.last.routing, config.n_experts, ALPHA)
        grad, = torch.autograd.grad(aux.loss, moe.router.gate.weight)
        out[name] = (aux.loss.item(), aux.f, aux.P, aux.tokens, grad)
    biases = []  # the DeepSeek layer, as on the ranks
    for step in range(BIAS_STEPS):
        moe(x[step], groups=n)
        update_router_bias(moe, GAMMA)
        biases.append(moe.router.bias.clone())
    return out, biases


@pytest.mark.parametrize("backend, n", [("gloo", 2), ("toy", 2), ("gloo", 4)])
def test_expert_parallel_balancing_adds_up_to_one_process(backend, n):
    ranks = run(_balance_rank, n, backend=backend)
    want, want_biases = _reference(n)
    for name, _ in CASES:
        loss, f, P, tokens, grad = want[name]
        assert abs(sum(rank[0][name][0] for rank in ranks) - loss) < 1e-6, name
        assert (sum(rank[0][name][4] for rank in ranks) - grad).abs().max().item() < 1e-6, name
        for rank_out, _ in ranks:
            _, f_r, P_r, tokens_r, _ = rank_out[name]
            assert torch.equal(f_r, f) and tokens_r == tokens == n * TOKENS, name
            assert (P_r - P).abs().max().item() < 1e-6, name
        assert grad.abs().max().item() > 1e-4, name  # a gradient worth comparing
    for step in range(BIAS_STEPS):
        assert all(torch.equal(biases[step], want_biases[step]) for _, biases in ranks), step
    assert want_biases[-1].abs().min().item() > 0  # every expert's bias has moved


# --- bad values ----------------------------------------------------------------------------

def test_moe_balancing_bad_values_are_named():
    moe = MoE(MoEConfig(D, 16, 4, top_k=2, router="deepseek"))
    with pytest.raises(ValueError, match="run a forward pass first"):
        update_router_bias(moe)
    moe(torch.randn(6, D))
    routing = moe.last.routing
    with pytest.raises(ValueError, match=r"alpha must be a non-negative number .* got -0\.1"):
        load_balancing_loss(routing, 4, alpha=-0.1)
    with pytest.raises(ValueError, match=r"n_experts=5 does not match .* shape \(6, 4\)"):
        load_balancing_loss(routing, 5)
    for gamma in (0, -1e-3, float("nan")):
        with pytest.raises(ValueError, match=f"gamma must be a positive number .* got {gamma}"):
            update_router_bias(moe, gamma=gamma)
    for config in (MoEConfig(D, 16, 4, top_k=1, router="switch"), MoEConfig(D, 16, 4)):
        plain = MoE(config)
        plain(torch.randn(6, D))
        with pytest.raises(ValueError, match=f"router='{config.router}' has none"):
            update_router_bias(plain)
    with pytest.raises(ValueError, match="takes the MoE layer .* got Router"):
        update_router_bias(moe.router)
