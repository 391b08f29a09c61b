"""From episodes to rows: advantages and aggregation against hand-computed values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_lightning import ChatRequest, Completion, Reward, Status, Step, Trajectory
from agentgym_lightning.training.config import LightningRLConfig
from agentgym_lightning.training.samples import ADVANTAGE_EPS, build_samples, configured_samples

EPS = ADVANTAGE_EPS


def call(index, prompt, completion, *, rewards=(), trainable=True, logprob=-0.5, finish="stop"):
    return Step(
        index=index,
        request=ChatRequest(messages=[{"role": "user", "content": "q"}]),
        completion=Completion(
            text="x",
            finish_reason=finish,
            prompt_token_ids=list(prompt),
            completion_token_ids=list(completion),
            logprobs=[logprob] * len(completion),
        ),
        rewards=[Reward(value=v, source=s) for s, v in rewards],
        trainable=trainable,
    )


def episode(eid, group, steps, final, status=Status.SUCCEEDED):
    return Trajectory(episode_id=eid, group_id=group, steps=list(steps), final_reward=final, status=status)


def advantages_of(trajectories, **options):
    """What :func:`build_samples` made of ``trajectories`` before the rows: each call's advantage
    by episode, each group's zero-variance flag, and the counts."""
    batch = build_samples(trajectories, **options)
    return batch.advantages, batch.zero_variance, batch.stats


def sample_std(xs):
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def two_call_group():
    """A: two calls, an AIR reward on the first, final 1. B: one call, final 0. C: infra failure."""
    a = episode("A", "g", [call(0, [1, 2], [3, 4], rewards=[("air", 0.2)]), call(1, [1, 2, 3, 4, 9], [5])], 1.0)
    b = episode("B", "g", [call(0, [1, 2], [6, 7, 8])], 0.0)
    c = episode("C", "g", [call(0, [1, 2], [6])], None, Status.INFRA_FAILED)
    return [a, b, c]


def test_identical_credit_is_grpo_over_episodes_shared_by_their_calls():
    adv, flat, counts = advantages_of(two_call_group(), credit="identical")
    # returns: A = 0.2 + 1.0 = 1.2, B = 0.0 (C excluded)
    sigma = sample_std([1.2, 0.0])
    assert adv["A"] == pytest.approx([0.6 / (sigma + EPS)] * 2)
    assert adv["B"] == pytest.approx([-0.6 / (sigma + EPS)])
    assert "C" not in adv and counts["episodes/infra_failed"] == 1
    assert flat == {"g": False}


def test_discounted_credit_values_per_call_with_an_episode_level_baseline():
    adv, _, _ = advantages_of(two_call_group(), credit="discounted", credit_kwargs={"gamma": 0.5})
    # A's step rewards: [0.2, 0 + final 1.0] -> values [0.2 + 0.5 * 1.0, 1.0] = [0.7, 1.0]; B: [0.0]
    means = [0.85, 0.0]
    mu, sigma = 0.425, sample_std(means)
    assert adv["A"] == pytest.approx([(0.7 - mu) / (sigma + EPS), (1.0 - mu) / (sigma + EPS)])
    assert adv["B"] == pytest.approx([(0.0 - mu) / (sigma + EPS)])


def test_final_only_credit():
    adv, _, _ = advantages_of(two_call_group(), credit="final-only")
    # A: [0.2, 1.0] (mean 0.6), B: [0.0]
    mu, sigma = 0.3, sample_std([0.6, 0.0])
    assert adv["A"] == pytest.approx([(0.2 - mu) / (sigma + EPS), (1.0 - mu) / (sigma + EPS)])
    assert adv["B"] == pytest.approx([-mu / (sigma + EPS)])


def test_scale_rewards_none_and_batch():
    groups = two_call_group() + [
        episode("D", "h", [call(0, [1], [2])], 1.0),
        episode("E", "h", [call(0, [1], [3])], 0.5),
    ]
    none, _, _ = advantages_of(groups, scale_rewards="none")
    assert none["A"] == pytest.approx([0.6, 0.6]) and none["D"] == pytest.approx([0.25])
    batch, _, _ = advantages_of(groups, scale_rewards="batch")
    sigma = sample_std([1.2, 0.0, 1.0, 0.5])
    assert batch["E"] == pytest.approx([-0.25 / (sigma + EPS)])


def test_transition_rows_and_equal_episode_weights():
    batch = build_samples(two_call_group(), aggregation="transition")
    rows = {(s.episode_id, tuple(s.steps)): s for s in batch.samples}
    assert set(rows) == {("A", (0,)), ("A", (1,)), ("B", (0,))}
    a0, a1, b0 = rows[("A", (0,))], rows[("A", (1,))], rows[("B", (0,))]
    assert a0.prompt_ids == [1, 2] and a0.completion_ids == [3, 4] and a0.loss_mask == [1, 1]
    assert a1.prompt_ids == [1, 2, 3, 4, 9] and a1.completion_ids == [5]
    assert a0.weight == a1.weight == 0.5 and b0.weight == 1.0  # A's two calls weigh what B's one does
    assert a0.sampling_logprobs == [-0.5, -0.5]
    sigma = sample_std([1.2, 0.0])
    assert a0.advantages == pytest.approx([0.6 / (sigma + EPS)] * 2)
    assert batch.stats["episodes/infra_failed"] == 1 and batch.stats["rows"] == 3 and batch.stats["loss_tokens"] == 6
    assert batch.stats["tokens/total"] == sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch.samples) == 4 + 6 + 5


def test_the_batch_keeps_each_calls_value_and_advantage_and_each_groups_zero_variance():
    tied = [episode("T1", "t", [call(0, [1], [2])], 1.0), episode("T2", "t", [call(0, [1], [3])], 1.0)]
    episodes = two_call_group() + tied + [episode("L", None, [call(0, [1], [4])], 0.5)]
    batch = build_samples(episodes, credit="discounted", credit_kwargs={"gamma": 0.5})
    assert batch.zero_variance == {"g": False, "t": True}
    # every episode that ended has its calls' values; only those compared in a group have advantages
    assert batch.values == {"A": pytest.approx([0.7, 1.0]), "B": [0.0], "T1": [1.0], "T2": [1.0], "L": [0.5]}
    assert set(batch.advantages) == {"A", "B", "T1", "T2"} and batch.advantages["T1"] == batch.advantages["T2"] == [0.0]
    mu, sigma = 0.425, sample_std([0.85, 0.0])  # as in the discounted test above
    assert batch.advantages["A"] == pytest.approx([(0.7 - mu) / (sigma + EPS), (1.0 - mu) / (sigma + EPS)])
    # the rows carry those advantages: the tied group's are skipped (zero_variance_groups="skip")
    assert {(r.episode_id, r.steps[0]): r.advantages[0] for r in batch.samples} == {
        ("A", 0): batch.advantages["A"][0], ("A", 1): batch.advantages["A"][1], ("B", 0): batch.advantages["B"][0]
    }


def test_configured_samples_builds_the_rows_as_the_config_says():
    config = LightningRLConfig(aggregation="trajectory", credit="final-only", episode_weighting="per_call", scale_rewards="none")
    expected = build_samples(
        two_call_group(), aggregation="trajectory", credit="final-only", episode_weighting="per_call", scale_rewards="none"
    )
    assert expected != build_samples(two_call_group())  # the options change the rows...
    assert configured_samples(two_call_group(), config) == expected  # ...and the config passes every one
    assert configured_samples(two_call_group(), LightningRLConfig()) == build_samples(two_call_group())


def test_per_call_weighting():
    batch = build_samples(two_call_group(), episode_weighting="per_call")
    assert [s.weight for s in batch.samples] == [1.0, 1.0, 1.0]


def test_trajectory_mode_merges_calls_whose_prompt_extends_the_last_and_masks_the_tokens_between():
    batch = build_samples(two_call_group(), aggregation="trajectory")
    a = next(s for s in batch.samples if s.episode_id == "A")
    # call 1's prompt = call 0's prompt + completion + [9] (a tool result): one row
    assert a.prompt_ids == [1, 2] and a.completion_ids == [3, 4, 9, 5]
    assert a.loss_mask == [1, 1, 0, 1]
    assert a.sampling_logprobs[:2] == [-0.5, -0.5] and math.isnan(a.sampling_logprobs[2]) and a.sampling_logprobs[3] == -0.5
    adv = 0.6 / (sample_std([1.2, 0.0]) + EPS)
    assert a.advantages == pytest.approx([adv, adv, 0.0, adv])
    assert a.weight == 1.0 and a.steps == [0, 1]
    assert batch.stats["trajectory/merged_calls"] == 1 and batch.stats.get("trajectory/fallbacks", 0) == 0


def test_trajectory_mode_falls_back_to_a_new_row_on_a_prefix_mismatch():
    rebuilt = episode("A", "g", [call(0, [1, 2], [3, 4]), call(1, [1, 7, 9], [5])], 1.0)  # prompt rebuilt
    other = episode("B", "g", [call(0, [1, 2], [6])], 0.0)
    batch = build_samples([rebuilt, other], aggregation="trajectory")
    rows = [s for s in batch.samples if s.episode_id == "A"]
    assert [r.completion_ids for r in rows] == [[3, 4], [5]] and [r.weight for r in rows] == [0.5, 0.5]
    assert batch.stats["trajectory/fallbacks"] == 1 and batch.stats.get("trajectory/merged_calls", 0) == 0


def test_discounted_values_stay_per_call_inside_a_merged_row():
    batch = build_samples(two_call_group(), aggregation="trajectory", credit="discounted", credit_kwargs={"gamma": 0.5})
    a = next(s for s in batch.samples if s.episode_id == "A")
    sigma = sample_std([0.85, 0.0])
    first, second = (0.7 - 0.425) / (sigma + EPS), (1.0 - 0.425) / (sigma + EPS)
    assert a.advantages == pytest.approx([first, first, 0.0, second])


def test_non_trainable_calls_never_reach_the_loss():
    checker = episode(
        "A", "g", [call(0, [1], [2]), call(1, [1, 2, 3], [4, 4], trainable=False), call(2, [1, 2, 3, 4, 4, 5], [6])], 1.0
    )
    other = episode("B", "g", [call(0, [1], [7])], 0.0)
    transition = build_samples([checker, other])
    assert all(1 not in s.steps for s in transition.samples)
    assert transition.stats["calls/not_trainable"] == 1
    merged = build_samples([checker, other], aggregation="trajectory")
    a = next(s for s in merged.samples if s.episode_id == "A")
    assert a.completion_ids == [2, 3, 4, 4, 5, 6] and a.loss_mask == [1, 0, 0, 0, 0, 1]  # kept as context, masked


def test_the_trainers_agent_match_leaves_the_other_agents_calls_out_of_the_loss():
    # writer -> checker -> rewriter, as the LangGraph SQL agent names its nodes
    steps = [call(0, [1], [2]), call(1, [1, 2, 3], [4, 4]), call(2, [1, 2, 3, 4, 4, 5], [6])]
    for step, name in zip(steps, ("writer", "checker", "rewriter")):
        step.agent = name
    graph = episode("A", "g", steps, 1.0)
    other = episode("B", "g", [call(0, [1], [7])], 0.0)
    other.steps[0].agent = "writer"
    transition = build_samples([graph, other], agent_match="writer|rewriter")
    assert sorted((s.episode_id, s.steps[0]) for s in transition.samples) == [("A", 0), ("A", 2), ("B", 0)]
    assert transition.stats["calls/agent_match_excluded"] == 1 and transition.stats["calls/trained"] == 3
    merged = build_samples([graph, other], aggregation="trajectory", agent_match={"agent": "writer|rewriter"})
    a = next(s for s in merged.samples if s.episode_id == "A")
    assert a.completion_ids == [2, 3, 4, 4, 5, 6] and a.loss_mask == [1, 0, 0, 0, 0, 1]  # the checker's reply: context only
    # the advantages are the episodes' whoever made the calls: A's rows all carry A's advantage
    full = build_samples([graph, other])
    assert {s.advantages[0] for s in transition.samples if s.episode_id == "A"} == {
        s.advantages[0] for s in full.samples if s.episode_id == "A"
    }
    assert build_samples([graph, other], agent_match="nobody").samples == []


def test_zero_variance_groups_are_skipped_or_kept_with_zero_advantage():
    same = [episode("A", "g", [call(0, [1], [2])], 1.0), episode("B", "g", [call(0, [1], [3])], 1.0)]
    varied = [episode("C", "h", [call(0, [1], [2])], 1.0), episode("D", "h", [call(0, [1], [3])], 0.0)]
    skipped = build_samples(same + varied)
    assert {s.episode_id for s in skipped.samples} == {"C", "D"}
    assert skipped.stats["groups/zero_variance"] == 1 and skipped.stats["episodes/zero_variance_skipped"] == 2
    kept = build_samples(same + varied, zero_variance_groups="keep")
    assert {s.episode_id for s in kept.samples} == {"A", "B", "C", "D"}
    assert all(a == 0.0 for s in kept.samples if s.episode_id in "AB" for a in s.advantages)


def test_a_group_left_with_one_episode_is_skipped_and_counted():
    lone = [episode("A", "g", [call(0, [1], [2])], 1.0), episode("B", "g", [call(0, [1], [3])], None, Status.INFRA_FAILED)]
    batch = build_samples(lone)
    assert batch.samples == [] and batch.stats["groups/too_small"] == 1 and batch.stats["episodes/infra_failed"] == 1


def test_calls_without_token_ids_and_truncated_completions():
    no_ids = call(1, [1], [2])
    no_ids.completion.prompt_token_ids = None
    a = episode("A", "g", [call(0, [1], [2], finish="length"), no_ids], 1.0)
    b = episode("B", "g", [call(0, [1], [3])], 0.0)
    batch = build_samples([a, b], mask_truncated_completions=True)
    assert [s.episode_id for s in batch.samples] == ["B"]
    assert batch.stats["calls/without_token_ids"] == 1 and batch.stats["calls/truncated_masked"] == 1


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="aggregation"):
        build_samples([], aggregation="episode")
    with pytest.raises(ValueError, match="unknown credit strategy 'nope'"):
        build_samples(two_call_group(), credit="nope")


def tied_discounted_group():
    """Two episodes with the same return (1.0) whose calls get different discounted values."""
    a = episode("A", "g", [call(0, [1], [2]), call(1, [1, 2, 5], [3])], 1.0)
    b = episode("B", "g", [call(0, [1], [4]), call(1, [1, 4, 5], [6])], 1.0)
    return [a, b]


@pytest.mark.parametrize(
    ("credit", "kwargs"), [("identical", {}), ("discounted", {"gamma": 0.5}), ("final-only", {})]
)
def test_a_group_whose_returns_tie_is_zero_variance_under_every_credit_strategy(credit, kwargs):
    # Before: discounted values [0.5, 1.0] in both episodes -> sigma 0 -> advantages of +-2,500.
    adv, flat, counts = advantages_of(tied_discounted_group(), credit=credit, credit_kwargs=kwargs)
    assert flat == {"g": True} and counts["groups/zero_variance"] == 1
    assert all(a == 0.0 for values in adv.values() for a in values)
    skipped = build_samples(tied_discounted_group(), credit=credit, credit_kwargs=kwargs)
    assert skipped.samples == [] and skipped.stats["episodes/zero_variance_skipped"] == 2
    kept = build_samples(tied_discounted_group(), credit=credit, credit_kwargs=kwargs, zero_variance_groups="keep")
    assert len(kept.samples) == 4 and all(a == 0.0 for s in kept.samples for a in s.advantages)


def test_a_group_whose_episode_means_tie_but_returns_differ_is_zero_variance():
    # final-only: A's calls [0, 2] (mean 1, return 2), B's [1] (mean 1, return 1): sigma is 0, so
    # dividing A's per-call differences by 1e-4 would give +-10,000.
    a = episode("A", "g", [call(0, [1], [2]), call(1, [1, 2, 5], [3])], 2.0)
    b = episode("B", "g", [call(0, [1], [4])], 1.0)
    adv, flat, _ = advantages_of([a, b], credit="final-only")
    assert flat == {"g": True} and all(x == 0.0 for v in adv.values() for x in v)


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(st.lists(st.floats(-1, 1), min_size=1, max_size=4), min_size=2, max_size=4),
    final=st.floats(-1, 1),
    gamma=st.floats(0, 1),
)
def test_advantages_never_blow_up_when_a_groups_returns_tie(rewards, final, gamma):
    # Every episode gets the same return whatever its per-call rewards: shift its final reward.
    members = []
    for i, rs in enumerate(rewards):
        steps = [call(j, [1], [2], rewards=[("air", r)]) for j, r in enumerate(rs)]
        members.append(episode(f"E{i}", "g", steps, final - sum(s.reward for s in steps)))
    adv, flat, _ = advantages_of(members, credit="discounted", credit_kwargs={"gamma": gamma})
    assert flat == {"g": True}
    assert all(x == 0.0 for v in adv.values() for x in v)


def test_calls_trained_on_a_repeated_user_turn_are_counted_and_trained_as_sent():
    twice = ChatRequest(messages=[{"role": "user", "content": "q"}, {"role": "user", "content": "q"}])
    a, b = two_call_group()[:2]
    a.steps[0].request = twice
    b.steps[0].request = twice
    b.steps[0].trainable = False  # not trained: not counted
    batch = build_samples([a, b], aggregation="transition")
    assert batch.stats["calls/repeated_user_turn"] == 1 and batch.stats["calls/trained"] == 2
    row = next(r for r in batch.samples if r.episode_id == "A" and r.steps == [0])
    assert sum(row.loss_mask) == 2  # kept in the loss, as the policy saw it
