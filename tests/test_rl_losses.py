"""The trainer's numeric helpers and rewards against values computed by hand."""

import math

import pytest

torch = pytest.importorskip("torch")

from omtr.pddl.categories import Category  # noqa: E402
from omtr.rl import losses as L  # noqa: E402
from omtr.rl.advantages import ADVANTAGE_ESTIMATORS, Trajectory  # noqa: E402
from omtr.rl.rewards import LADDER, OUTCOME_SCORES, actor_reward, editor_reward  # noqa: E402
from omtr.solver.verdict import Verdict  # noqa: E402


def approx(x, rel=1e-4, abs=1e-5):
    return pytest.approx(x, rel=rel, abs=abs)


def test_ppo_clip_loss_by_hand():
    # sequence 0, A=+1: ratios 1.5 (clipped to 1.2) and 0.9 -> token losses -1.2, -0.9 -> mean -1.05
    # sequence 1, A=-1: ratio 0.5 (clipped to 0.8) -> loss 0.8; its second position is padding
    old = torch.zeros(2, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.9)], [math.log(0.5), 7.0]])
    mask = torch.tensor([[True, True], [True, False]])
    loss, frac = L.ppo_clip_loss(logp, old, torch.tensor([1.0, -1.0]), mask, 0.2)
    assert loss.item() == approx((-1.05 + 0.8) / 2)
    assert frac.item() == approx(2 / 3)


def test_ppo_gradient_vanishes_when_clipped():
    logp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, _ = L.ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1, dtype=torch.bool), 0.2)
    loss.backward()
    assert logp.grad.abs().item() == 0.0
    logp = torch.tensor([[math.log(1.1)]], requires_grad=True)
    loss, _ = L.ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1, dtype=torch.bool), 0.2)
    loss.backward()
    assert logp.grad.item() == approx(-1.1)  # d(-A r)/dlogp = -A r


def test_kl_k3_and_masked_helpers():
    kl = L.kl_k3(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    assert kl.item() == approx(0.5 + math.log(0.5) * -1 - 1)  # 0.19315
    assert L.kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[True, True, True, False]])
    assert L.masked_mean(x, m).item() == approx(2.0)
    w = L.masked_whiten(x, m)
    assert w.tolist()[0] == [approx(-1.224745), approx(0.0), approx(1.224745), 0.0]
    assert L.whiten([1.0, 3.0]) == [approx(-1.0), approx(1.0)]
    assert L.whiten([5.0]) == [0.0]
    # seq_mean averages per sequence first: (1+2+3)/3 and 10 -> 6
    xs = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0]])
    ms = torch.tensor([[True, True, True], [True, False, False]])
    assert L.seq_mean(xs, ms).item() == approx(6.0)


def test_gae_by_hand():
    adv, ret = L.gae([0.0, 0.0, 1.0], [0.5, 0.4, 0.6], gamma=0.9, lam=0.5)
    # t=2: 1 - .6 = .4; t=1: .9*.6 - .4 = .14 + .45*.4 = .32; t=0: .9*.4 - .5 = -.14 + .45*.32 = .004
    assert adv == [approx(0.004), approx(0.32), approx(0.4)]
    assert ret == [approx(0.504), approx(0.72), approx(1.0)]
    adv1, _ = L.gae([1.15], [0.4], gamma=0.9, lam=0.95)  # the Actor's one step: R - V
    assert adv1 == [approx(0.75)]
    with pytest.raises(ValueError):
        L.gae([1.0], [0.1, 0.2], 0.9, 0.9)


def test_discounted_credit_and_group_baseline():
    assert L.discounted_credit(0.8, 3, 0.9) == [approx(0.648), approx(0.72), approx(0.8)]
    g = ["a", "a", "a", "a", "b"]
    assert L.group_advantages([1, 0, 0, 1, 5], g, scale=False) == [0.5, -0.5, -0.5, 0.5, 0.0]
    assert L.group_advantages([1, 0, 0, 1, 5], g, scale=True) == [approx(1.0), approx(-1.0), approx(-1.0),
                                                                   approx(1.0), 0.0]
    assert L.group_advantages([2, 2], ["x", "x"]) == [0.0, 0.0]  # no spread: no signal, no blow-up


def test_estimators_registry():
    assert {"gae", "group"} <= set(ADVANTAGE_ESTIMATORS)
    trajs = [Trajectory("t1", "editor", [0.0, 0.8], values=[0.2, 0.5]), Trajectory("t1", "actor", [1.0], values=[0.25])]
    adv, ret = ADVANTAGE_ESTIMATORS["gae"](trajs, 0.9, 1.0, True)
    # editor: t=1: .8 - .5 = .3; t=0: .9*.5 - .2 = .25 + .9*.3 = .52
    assert adv[0] == [approx(0.52), approx(0.3)] and adv[1] == [approx(0.75)]
    assert ret[0] == [approx(0.72), approx(0.8)]
    trajs = [Trajectory("t1", "actor", [1.0]), Trajectory("t1", "actor", [0.0]),
             Trajectory("t1", "editor", [0.0, 0.8]), Trajectory("t1", "editor", [0.0, 0.0, -0.3])]
    adv, ret = ADVANTAGE_ESTIMATORS["group"](trajs, 0.9, 0.95, False)
    assert adv[0] == [0.5] and adv[1] == [-0.5]
    # editor episode returns .8 and -.3: mean .25 -> .55 and -.55, credited back with gamma
    assert adv[2] == [approx(0.495), approx(0.55)]
    assert adv[3] == [approx(-0.55 * 0.81), approx(-0.55 * 0.9), approx(-0.55)]
    assert ret[2] == [approx(0.72), approx(0.8)]


def test_band_penalty_and_judge_loss_by_hand():
    s = torch.tensor([0.8, 0.2, 0.8, 0.3])
    b = torch.tensor([0.0, 1.0, 1.0, 0.0])
    assert L.band_penalty(s, b).tolist() == [approx(0.09), approx(0.045), 0.0, 0.0]
    total, bce, band = L.judge_loss(torch.tensor([0.8, 0.2]), torch.tensor([1.0, 0.0]), band_weight=0.5)
    assert bce.item() == approx(-math.log(0.8)) and band.item() == 0.0 and total.item() == approx(-math.log(0.8))
    total, bce, band = L.judge_loss(torch.tensor([0.8]), torch.tensor([0.0]), band_weight=0.5)
    assert bce.item() == approx(-math.log(0.2)) and band.item() == approx(0.09)
    assert total.item() == approx(-math.log(0.2) + 0.045)


def test_judge_reward_and_calibration_numbers():
    r = L.thresholded_judge_reward
    assert [r(0.7, True), r(0.7, False), r(0.3, False), r(0.3, True), r(0.5, True)] == [1.0, -1.0, 0.5, -0.5, 1.0]
    assert L.brier_score([0.8, 0.2], [True, False]) == approx(0.04)
    assert L.brier_score([], []) is None
    # ECE, 10 bins: {0.1, 0.15} in bin 1 (mean .125, acc 0), {0.9} in bin 9 (acc 1): 2/3*.125 + 1/3*.1
    assert L.expected_calibration_error([0.1, 0.15, 0.9], [False, False, True]) == approx(2 / 3 * 0.125 + 1 / 3 * 0.1)
    assert L.binary_auc([0.9, 0.1, 0.5, 0.5], [True, False, True, False]) == approx(0.875)


def _v(success=False, cat=None, **kw):
    return Verdict(success=success, category=cat, **kw)


def test_outcome_scores_and_role_rewards():
    vs = [_v(True), _v(cat=Category.SYNTAX), _v(cat=Category.PREDICATE_SCHEMA),
          _v(cat=Category.GOAL_CONSTRAINT), _v(cat=Category.UNREACHABLE_SEARCH),
          _v(cat=Category.UNREACHABLE_SEARCH, timed_out=True), _v(cat=Category.UNREACHABLE_SEARCH, too_large=True)]
    texts = [""] * len(vs)
    assert OUTCOME_SCORES["binary"](texts, verdicts=vs) == [1.0, 0.0, 0.0, 0.0, 0.0, None, None]
    assert OUTCOME_SCORES["shaped"](texts, verdicts=vs) == [1.0, 0.0, 0.4, 0.6, 0.8, None, None]
    # nontrivial: the paper's binary, but a solved spec whose plan is empty (its goal already holds
    # in its own initial state) earns nothing
    solved = [_v(True, plan=["(pick-up a)"]), _v(True, plan=[]), _v(cat=Category.SYNTAX),
              _v(True, plan=[], timed_out=True)]
    assert OUTCOME_SCORES["nontrivial"]([""] * 4, verdicts=solved) == [1.0, 0.0, 0.0, None]
    assert OUTCOME_SCORES["binary"]([""] * 4, verdicts=solved) == [1.0, 1.0, 0.0, None]
    ladder = [LADDER[k] for k in ("syntax", "object_type", "predicate_schema", "precondition_effect",
                                  "unreachable_search", "success")]
    assert ladder == sorted(ladder) and len(set(ladder)) == len(ladder)
    assert actor_reward(1.0, 0.5, 0.3) == approx(1.15)
    assert actor_reward(0.0, None, 0.3) == 0.0
    assert actor_reward(None, 0.9, 0.3) is None  # a limited verdict: no reward, logged apart
    assert editor_reward(1.0, 2, 0.1) == approx(0.8)
    assert editor_reward(None, 2, 0.1) is None


def test_a_non_finite_gradient_skips_the_step_and_keeps_the_parameters(caplog):
    """A NaN gradient (an overflowed loss) would write NaN into the parameters and Adam's moments for
    good; the torch backend skips that step, says so, and the next finite step trains as usual."""
    import logging

    import torch
    from torch import nn

    from omtr.rl.config import TrainConfig
    from omtr.rl.engine import TorchBackend, TrainModules

    torch.manual_seed(0)
    mods = TrainModules({"actor": nn.Linear(3, 1)}, nn.Linear(3, 1))
    backend = TorchBackend(mods, TrainConfig(lr=0.1))
    before = [p.detach().clone() for p in mods.parameters()]
    x = torch.ones(2, 3)
    backend.zero_grad()
    (mods.models["actor"](x).sum() * float("nan") + mods.value_head(x).sum()).backward()
    with caplog.at_level(logging.WARNING, logger="omtr.rl.engine"):
        norm = backend.step()
    assert norm != norm and backend.skipped_steps == 1 and "optimizer step skipped" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(before, mods.parameters()))
    backend.zero_grad()
    (mods.models["actor"](x).sum() + mods.value_head(x).sum()).backward()
    assert backend.step() > 0 and backend.skipped_steps == 1
    after = list(mods.parameters())
    assert all(torch.isfinite(p).all() for p in after) and not torch.equal(before[0], after[0])

