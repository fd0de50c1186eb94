"""The domain-given mode: a task comes with its domain (an input), the model writes only the problem.

Records carry ``domain`` (kept by the training view, linted on reading; the reference problem stays
unreachable), ``omtr tasks generate|import-planbench --given-domain`` write it, prompts show it and
ask for the problem, extraction pairs the problem with it, the real planner verifies (given
domain, problem), every baseline writes only the problem, and the mode is in every trace and
episode log. The role-model paths (infer, evaluate, one training update) run on ``micro``.
"""

from __future__ import annotations

import json
import random

import pytest

from omtr.cli import main
from omtr.inference import prompts as P
from omtr.inference.episode import run_episodes
from omtr.inference.extract import extract_spec, extraction_verdict, problem_complete
from omtr.inference.scripted import ScriptedPolicy
from omtr.solver import SolverPool
from omtr.tasks import GivenDomainError, ReferenceSpec, Task, TaskFormatError, load_tasks, load_training_tasks, write_tasks
from omtr.tasks.generators import generate
from omtr.tasks.training import TrainingTask

DOMAIN = P.DEMOS["blocksworld"].domain  # lint-clean, STRIPS, names of its own
PROBLEM = """(define (problem two)
  (:domain blocks)
  (:objects a b)
  (:init (clear a) (clear b) (on-table a) (on-table b) (hand-empty))
  (:goal (on a b)))"""
BROKEN = DOMAIN.replace("(:predicates (clear ?b)", "(:predicates")  # `clear` used but no longer declared
NL = "Two blocks a and b lie on the table; my hand is empty. Put a on b."

class Recording:
    """The real solver pool, remembering every (domain, problem) it was asked to verify."""

    def __init__(self, pool):
        self.pool, self.specs = pool, []

    def solve_many(self, specs):
        self.specs.extend(specs)
        return self.pool.solve_many(specs)


@pytest.fixture(scope="module")
def pool():
    with SolverPool(1) as p:
        yield p


@pytest.fixture(scope="module")
def given_file(tmp_path_factory):
    """Generated tasks (BlocksWorld 2-3 blocks, Gripper 1-2 balls) with their domains given."""
    p = tmp_path_factory.mktemp("given") / "given.jsonl"
    assert main(["-q", "tasks", "generate", "--family", "blocksworld", "--n", "2", "--seed", "3", "--min-objects", "2",
                 "--max-objects", "3", "--no-verify", "--given-domain", "--out", str(p)]) == 0
    return p


# ----------------------------------------------------------------------------- records


def test_record_carries_a_given_domain_as_an_input(tmp_path):
    t = Task("g1", "blocksworld", "test", NL, ReferenceSpec(DOMAIN, PROBLEM), domain=DOMAIN)
    assert t.mode == "domain-given" and Task("f", None, None, NL).mode == "full"
    path = tmp_path / "t.jsonl"
    write_tasks(path, [t])
    assert load_tasks(path) == [t]
    (tr,) = load_training_tasks(path)
    assert tr.domain == DOMAIN and tr.mode == "domain-given"
    assert t.for_training() == tr
    assert json.loads(path.read_text())["domain"] == DOMAIN


def test_a_broken_given_domain_is_an_input_error_naming_file_and_task(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "ok", "nl": NL, "domain": DOMAIN}) + "\n"
                    + json.dumps({"id": "mine-7", "nl": NL, "domain": BROKEN}) + "\n")
    for load in (load_tasks, load_training_tasks):
        with pytest.raises(GivenDomainError) as e:
            load(path)
        msg = str(e.value)
        assert msg.startswith(f"{path}:2: task 'mine-7': its given domain does not lint (predicate_schema: ")
        assert "`clear`" in msg and "fix the record's 'domain' field" in msg and "\n" not in msg
    path.write_text(json.dumps({"id": "n", "nl": NL, "domain": {"x": 1}}) + "\n")
    with pytest.raises(TaskFormatError, match=r":1: task 'n': 'domain' must be PDDL text"):
        load_training_tasks(path)
    with pytest.raises(GivenDomainError, match="task 'x': its given domain does not lint"):
        TrainingTask("x", None, None, NL, domain="(define (domain")


def test_tasks_cli_writes_the_family_domain(tmp_path, given_file):
    for t in load_tasks(given_file):
        assert t.domain == t.reference.domain and t.mode == "domain-given"
    out = tmp_path / "pb.jsonl"
    assert main(["-q", "tasks", "import-planbench", "--family", "blocksworld_3", "--given-domain", "--out", str(out)]) == 0
    pb = load_tasks(out)
    assert len(pb) > 50 and all(t.domain == t.reference.domain for t in pb)
    assert main(["-q", "tasks", "import-planbench", "--family", "blocksworld_3", "--out", str(out)]) == 0
    assert all(t.domain is None for t in load_tasks(out))


# ----------------------------------------------------------------------------- prompts and extraction


def test_prompts_show_the_domain_and_ask_for_the_problem():
    t = TrainingTask("g", "gripper", None, NL, domain=DOMAIN)
    sys_, demo_q, demo_a, ask = P.actor_messages(t)
    assert "(define (problem" in sys_["content"] and "domain is given" in sys_["content"]
    demo = P.DEMOS["gripper"]
    assert demo_q["content"] == P.with_domain(demo.nl, demo.domain) and demo_a["content"] == demo.problem
    assert P.split_given(ask["content"]) == (NL, DOMAIN.strip())
    ed = P.editor_messages(t, PROBLEM, "syntax", "cut off")[-1]["content"]
    assert DOMAIN.strip() in ed and "Write the corrected problem in full." in ed
    assert P.spec_text(DOMAIN, PROBLEM, given=True) == PROBLEM
    judge = P.judge_messages(t, PROBLEM)[-1]["content"]
    assert NL in judge and DOMAIN.strip() in judge and PROBLEM in judge
    full = P.actor_messages(TrainingTask("f", "gripper", None, NL))
    assert full[2]["content"] == demo.answer and P.split_given(full[-1]["content"]) == (NL, None)


def test_extraction_takes_the_problem_and_pairs_it_with_the_given_domain():
    text = f"Here:\n```pddl\n{DOMAIN}\n```\n```pddl\n{PROBLEM}\n```"
    ex = extract_spec(text, DOMAIN)
    assert ex.ok and ex.domain == DOMAIN and ex.problem == PROBLEM
    assert any("domain is given" in n for n in ex.notes)
    cut = extract_spec(PROBLEM[:-3], DOMAIN)
    v = extraction_verdict(cut)
    assert v is not None and v.category.value == "syntax" and "problem block is never closed" in v.message
    assert "domain block" not in v.message and "The domain is given" in v.message
    assert problem_complete(PROBLEM) and not problem_complete(PROBLEM[:-1])
    assert not problem_complete(DOMAIN)


# ----------------------------------------------------------------------------- the loop


def test_loop_verifies_given_domain_with_the_generated_problem(pool):
    given = TrainingTask("g", "blocksworld", None, NL, domain=DOMAIN)
    full = TrainingTask("f", "blocksworld", None, "Same blocks, written in full: put a on b.")
    wrong_goal = PROBLEM.replace("(on a b)", "(on a c)")
    policy = ScriptedPolicy({given.nl: [f"```pddl\n{wrong_goal}\n```", PROBLEM],
                             full.nl: [f"{DOMAIN}\n\n{PROBLEM}"]})
    env = Recording(pool)
    eps = run_episodes([given, full], policy, env, budget=3)
    g, f = eps
    assert g.mode == "domain-given" and f.mode == "full"
    assert g.success and g.planner_calls == 2 and not g.actor_success
    assert g.steps[0].verdict.category.value == "goal_constraint"  # c is not an object of the problem
    assert f.success
    assert (DOMAIN, PROBLEM) in env.specs and (DOMAIN, wrong_goal) in env.specs
    # the modes were generated apart, and only the given batch was handed domains
    gen_calls = [(role, len(prompts)) for role, prompts in policy.calls if role != "judge"]
    assert sorted(gen_calls) == [("actor", 1), ("actor", 1), ("editor", 1)]
    assert sorted(map(str, policy.domains)) == sorted(map(str, [[DOMAIN], None, [DOMAIN]]))
    editor_prompt = next(p for role, p in policy.calls if role == "editor")[0][-1]["content"]
    assert "Problem written for it:\n" + wrong_goal in editor_prompt
    assert g.to_json()["mode"] == "domain-given" and g.to_json()["domain"] == DOMAIN


class _Backend:
    """An LLM backend answering each spec prompt with the problem alone; logs the prompts."""

    name = "fake"

    def __init__(self):
        self.prompts = []

    def chat(self, prompts, sampling, *, stop_when=None, grammar=False):
        from omtr.policy import Generation

        out = []
        for p in prompts:
            self.prompts.append(p)
            last = p[-1]["content"]
            text = "7" if "one number from 1 to 10" in last else (
                "objects a b" if "Be brief." in last else f"Thinking.\n```pddl\n{PROBLEM}\n```")
            out.append(Generation(text=text))
        return out


@pytest.mark.parametrize("name", ["cot", "tot", "llm+p", "self-refine"])
def test_every_baseline_writes_only_the_problem(name, pool):
    from omtr.inference.registry import make_policy

    task = TrainingTask("g", "blocksworld", None, NL, domain=DOMAIN)
    backend = _Backend()
    env = Recording(pool)
    (ep,) = run_episodes([task], make_policy(name, tasks=[task], backend=backend, budget=2), env, budget=2, judge=False)
    assert ep.success and env.specs == [(DOMAIN, PROBLEM)]
    for p in backend.prompts:
        text = "\n".join(m["content"] for m in p)
        if "one number from 1 to 10" in text:
            continue
        assert DOMAIN.strip() in text, name  # the domain is shown to every spec-writing prompt
        assert "domain and problem" not in p[-1]["content"] and "domain followed by" not in p[-1]["content"]
    if name == "llm+p":  # Liu et al.: the example's domain and problem file, then the new problem
        p = backend.prompts[0]
        assert p[2]["content"] == P.DEMOS["blocksworld"].problem and "problem file" in p[-1]["content"]


class _GrammarBackend:
    """A backend that takes given domains (as hf: and openai: do): logs (prompt, grammar, domains)
    per call; the first spec per task is broken (an undeclared predicate), the next right."""

    name = "grammar-fake"

    def __init__(self):
        self.calls, self.specs = [], 0

    def chat(self, prompts, sampling, *, stop_when=None, grammar=False, domains=None):
        from omtr.policy import Generation

        out = []
        for i, p in enumerate(prompts):
            self.calls.append((p, grammar, None if domains is None else domains[i]))
            last = p[-1]["content"]
            if "one number from 1 to 10" in last:
                out.append(Generation(text="7"))
            elif "Be brief." in last or "Do not write PDDL yet." in last:
                out.append(Generation(text="objects a b; a on b in the goal"))
            else:
                self.specs += 1
                text = PROBLEM.replace("(on a b))", "(onn a b))") if self.specs == 1 else PROBLEM
                out.append(Generation(text=f"```pddl\n{text}\n```"))
        return out


@pytest.mark.parametrize("name", ["cot", "tot", "llm+p", "self-refine"])
def test_baselines_given_a_domain_see_the_actors_demo_and_write_under_the_problem_grammar(name, pool):
    """Main's domain-given mode with issue 22's fairness: the Actor's demonstration in its given form
    (task with its domain, then the problem alone), spec-writing calls under the grammar with the
    given domain passed on (the backend's problem-only grammar), free-text calls without either."""
    from omtr.inference.registry import make_policy

    task = TrainingTask("g", "blocksworld", None, NL, domain=DOMAIN)
    backend, env = _GrammarBackend(), Recording(pool)
    (ep,) = run_episodes([task], make_policy(name, tasks=[task], backend=backend, budget=3), env, budget=3, judge=False)
    assert ep.success and [d for d, _ in env.specs] == [DOMAIN, DOMAIN] and env.specs[-1][1].strip() == PROBLEM
    demo = P.DEMOS["blocksworld"]
    spec_calls = [c for c in backend.calls if not any(k in c[0][-1]["content"] for k in
                                                      ("one number from 1 to 10", "Be brief.", "Do not write PDDL yet."))]
    free_calls = [c for c in backend.calls if c not in spec_calls]
    assert len(spec_calls) == 2 and all(g is True and d == DOMAIN for _, g, d in spec_calls)
    assert all(g is False and d is None for _, g, d in free_calls)
    assert bool(free_calls) == (name in ("cot", "tot"))  # CoT reasons, ToT thinks and rates, in free text
    for p, _, _ in spec_calls:
        if name == "llm+p":  # Liu et al.'s own setting, as main has it
            assert p[2] == {"role": "assistant", "content": demo.problem}
            continue
        i = p.index({"role": "user", "content": P.with_domain(demo.nl, demo.domain)})
        assert p[i + 1] == {"role": "assistant", "content": demo.problem}
        assert "domain and problem" not in p[-1]["content"] and "domain followed by" not in p[-1]["content"]
    if name == "self-refine":  # the Editor's view: the diagnostic's category, the problem rewritten
        last = spec_calls[1][0][-1]["content"]
        assert last.startswith("The planner rejected it (") and "write the problem in full" in last


def test_file_attempts_for_a_given_domain_are_problems_routed_by_id(pool, tmp_path):
    """file: in the domain-given mode: the loop passes domains= and task_ids= together; attempts
    are answered as problems alone (a domain an attempt carries is not used) and checked against
    the given domain."""
    from omtr.evaluation.harness import from_file

    twin = TrainingTask("g2", "blocksworld", None, NL, domain=DOMAIN)  # same NL text, own attempts
    task = TrainingTask("g", "blocksworld", None, NL, domain=DOMAIN)
    broken = PROBLEM.replace("(on a b))", "(onn a b))")
    f = tmp_path / "a.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"id": "g", "problem": broken}, {"id": "g", "domain": BROKEN, "problem": PROBLEM},
        {"id": "g2", "problem": PROBLEM}]) + "\n")
    policy = from_file(f, [task, twin], budget=3)
    env = Recording(pool)
    eps = run_episodes([task, twin], policy, env, budget=3, judge=False)
    assert [e.success for e in eps] == [True, True] and [len(e.steps) for e in eps] == [2, 1]
    assert sorted(env.specs) == sorted([(DOMAIN, broken), (DOMAIN, PROBLEM), (DOMAIN, PROBLEM)])
    assert all("(define (domain" not in s.text for e in eps for s in e.steps)
    assert policy.report["problem_only_attempts"] == 2


def test_evaluate_oracle_in_domain_given_mode_checks_problems(tmp_path, given_file, capsys):
    out = tmp_path / "oracle"
    assert main(["-q", "evaluate", "--policy", "oracle", "--tasks", str(given_file), "--workers", "1", "--bootstrap",
                 "0", "--no-report", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["success"] == 1.0 and m["faithful"] == 1.0 and m["modes"] == {"domain-given": 2}
    assert m["episode_log"]["valid"] is True
    recs = [json.loads(x) for x in (out / "traces.jsonl").read_text().splitlines()]
    tasks = {t.id: t for t in load_tasks(given_file)}
    for r in recs:
        assert r["mode"] == "domain-given" and r["domain"] == tasks[r["id"]].domain
        assert "(define (domain" not in r["steps"][0]["text"]  # the oracle, like a model here, wrote the problem
    import pandas as pd

    assert set(pd.read_parquet(out / "episodes.parquet")["mode"]) == {"domain-given"}
    assert "mode: domain-given 2" in capsys.readouterr().out


def test_episode_log_rejects_an_unknown_mode():
    pytest.importorskip("great_expectations")
    from omtr.validation.episodes import rows_from_traces, validate_episode_log

    rec = {"id": "t", "family": "blocksworld", "mode": "domain-given", "steps": [
        {"role": "actor", "index": 0, "domain": DOMAIN, "problem": PROBLEM, "verdict": {"success": True},
         "judge_score": 0.5, "new_tokens": 3, "times": {}}]}
    import pandas as pd

    rows = rows_from_traces([rec], "r", 0)
    assert {r["mode"] for r in rows} == {"domain-given"}
    assert validate_episode_log(pd.DataFrame(rows)).success
    res = validate_episode_log(pd.DataFrame([dict(r, mode="given") for r in rows]))
    assert not res.success and any(f.column == "mode" for f in res.failures)


# ----------------------------------------------------------------------------- the role model (micro)


def test_infer_rejects_a_broken_given_domain_before_loading_a_model(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "mine-7", "nl": NL, "domain": BROKEN}) + "\n")
    rc = main(["infer", "--model", "micro", "--tasks", str(path), "--out", str(tmp_path / "t.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert f"{path}:1: task 'mine-7': its given domain does not lint" in err[0]
    assert not (tmp_path / "t.jsonl").exists()


torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def micro():
    torch.set_num_threads(1)
    from omtr.model import build_model

    return build_model("micro")


def test_infer_and_evaluate_on_micro_write_problems_for_the_given_domain(tmp_path, given_file, capsys):
    traces = tmp_path / "traces.jsonl"
    assert main(["-q", "infer", "--model", "micro", "--tasks", str(given_file), "--out", str(traces), "--budget", "2",
                 "--max-new-tokens", "24", "--limit", "1", "--no-judge"]) == 0
    (rec,) = [json.loads(x) for x in traces.read_text().splitlines()]
    task = load_tasks(given_file)[0]
    assert rec["mode"] == "domain-given" and rec["domain"] == task.domain
    for s in rec["steps"]:
        # the problem-only grammar: the answer opens a problem, never a domain
        assert s["text"].lstrip().startswith("(define (problem") and "(define (domain" not in s["text"]
        assert s["domain"] == task.domain
    assert "mode: domain-given 1" in capsys.readouterr().out
    out = tmp_path / "eval"
    assert main(["-q", "evaluate", "--policy", "model", "--model", "micro", "--decoding", "plain", "--tasks",
                 str(given_file), "--limit", "1", "--budget", "1", "--max-new-tokens", "24", "--workers", "1",
                 "--bootstrap", "0", "--no-report", "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["modes"] == {"domain-given": 1} and m["episode_log"]["valid"] is True
    (rec,) = [json.loads(x) for x in (out / "traces.jsonl").read_text().splitlines()]
    assert rec["steps"][0]["text"].lstrip().startswith("(define (problem")


def test_one_training_update_in_domain_given_mode_replays_the_masks(tmp_path, micro):
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.solver import solve
    from omtr.validation.episodes import read_episode_log

    class Env:
        def solve_many(self, specs):
            return [solve(d, p) for d, p in specs]

    tasks = [t.with_given_domain().for_training()
             for t in generate("gripper", 2, 7, min_objects=1, max_objects=2, verify=False)]
    assert all(t.domain for t in tasks)
    cfg = train_profile("micro").replace(cycles=1, updates_per_cycle=1, episodes_per_batch=2, max_new_tokens=12,
                                         decoding="scoped", save_model_every_cycle=False, validate_logs=True,
                                         mlflow=False, kl_coef=0.0, advantage="gae")
    tr = Trainer(cfg, tasks, tmp_path / "run", env=Env(), quiet=True, model=micro)
    assert micro.cfg.constraint == "scoped"
    gens, given, replays = {}, [], []
    real_generate, real_lp = micro.generate, micro.token_logprobs

    def spy_generate(role, prompts, sampling, **kw):
        out = real_generate(role, prompts, sampling, **kw)
        given.append(kw.get("domains"))
        for prompt, g in zip(prompts, out):  # keyed by prompt too: answers of one task may share tokens
            gens[role, json.dumps(prompt), tuple(g.token_ids)] = g.logprobs
        return out

    def spy_lp(role, prompts, completions, **kw):
        logp, mask = real_lp(role, prompts, completions, **kw)
        replays.append((torch.is_grad_enabled(), kw.get("domains"),
                        [(role, json.dumps(p), tuple(c)) for p, c in zip(prompts, completions)], logp.detach()))
        return logp, mask

    micro.generate, micro.token_logprobs = spy_generate, spy_lp
    try:
        assert tr.run() == "finished"
    finally:
        del micro.generate, micro.token_logprobs
    assert given and all(ds and set(ds) <= {t.domain for t in tasks} for ds in given)
    assert replays and all(r[1] and set(r[1]) <= {t.domain for t in tasks} for r in replays)  # every pass had them
    # the reference pass (eval mode, the rollout's parameters: LoRA starts at zero) replays the
    # sampled distribution exactly: the same problem-only, scoped masks, forced tokens included
    checked = 0
    for grad, domains, keys, logp in replays:
        if grad:
            continue
        for b, key in enumerate(keys):
            sampled = gens[key]
            assert torch.allclose(logp[b, :len(sampled)], torch.tensor(sampled, dtype=logp.dtype), atol=1e-4), key[0]
            checked += 1
    assert checked >= 2
    log = tmp_path / "run" / "episodes" / "cycle-0000" / "update-000000.parquet"
    assert "passed" in log.with_suffix(".validation.txt").read_text()
    assert set(read_episode_log(log)["mode"]) == {"domain-given"}


def test_mutants_that_change_only_the_domain_leave_domain_given_tasks_out(given_file):
    from omtr.evaluation.harness import mutant

    tasks = load_tasks(given_file)
    full = [Task(t.id, t.family, t.split, t.nl, t.reference, t.meta) for t in tasks]
    from omtr.faithfulness.mutators import MUTATORS

    kinds = {"drop_goal_atom": False}  # a problem mutator applies in both modes
    domain_kinds = []
    for m in MUTATORS:
        out = m.fn(tasks[0].reference.domain, tasks[0].reference.problem, random.Random(0))
        if out is not None and out[1] == tasks[0].reference.problem and out[0] != tasks[0].reference.domain:
            domain_kinds.append(m.name)
    assert domain_kinds, "some mutator changes only the domain"
    kinds[domain_kinds[0]] = True
    for kind, domain_only in kinds.items():
        given, plain = mutant(kind, tasks), mutant(kind, full)
        if domain_only:
            assert tasks[0].id in given.excluded and "changes only the domain" in given.excluded[tasks[0].id]
            assert tasks[0].id not in plain.excluded
        else:
            assert tasks[0].id not in given.excluded


def test_hf_backend_decodes_a_given_domains_answer_under_the_problem_grammar():
    """``hf:`` hands ``domains=`` to the role model: that prompt's answer is a problem for the given
    domain (its name forced after ``(:domain``), the other prompt's a full spec."""
    from omtr.inference.backends import BackendError, make_backend
    from omtr.policy import Sampling

    b = make_backend("hf:micro")
    m = [{"role": "user", "content": NL}]
    given, full = b.chat([m, m], Sampling(max_new_tokens=40, greedy=True), grammar=True, domains=[DOMAIN, None])
    assert given.text.startswith("(define (problem ") and "(:domain blocks)" in given.text
    assert full.text.startswith("(define (domain ")
    with pytest.raises(BackendError, match="1 prompts but 2 given domains"):
        b.chat([m], Sampling(max_new_tokens=4), grammar=True, domains=[DOMAIN, None])
