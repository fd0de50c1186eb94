"""The paper's matched-budget baselines (appendix G.4, H.1), each a Policy over any LLM backend.

Every baseline runs through the same batched episode loop and the same budget of K planner calls
as omtr's own model. The loop asks for the Actor's answer first and for an "Editor" answer after
each failed verification; what a baseline does with that turn is what sets it apart:

* ``cot`` (chain of thought): reason about objects, predicates, actions, init and goal, then
  write the spec. Every turn is an independent sample of the same prompt (the first greedy when
  the run is greedy, then sampled at temperature 0.7 with a seed per sample); the diagnostic is
  never shown. The first solver success wins.
* ``tot`` (tree of thoughts): a breadth-first search over partial reasoning states — stage 1 the
  types and objects, stage 2 the predicates and actions — expanding ``breadth`` thoughts per state
  and keeping the ``beam`` states the model itself rates best (1-10). From the surviving states
  writes final specs, one per loop turn, from the states in rank order (round robin), so at most K
  final specs are written and checked. Only those final specs reach the planner.
* ``llm+p``: an in-context PDDL example (the family's hand-written demonstration) and fixed domain
  assumptions stated in the prompt; K independent samples, like ``cot``.
* ``self-refine`` (Self-Refine+Solver): the base model, no trained roles; each turn revises the
  latest spec from the planner's raw diagnostic, up to K - 1 = 5 rounds.

Fair to the Actor: every baseline is shown the family's demonstration the Actor is shown (one
task and its PDDL, ``omtr.inference.prompts.DEMOS``); Self-Refine reads the diagnostic's category
as the Editor does; the spec-writing calls decode under omtr's PDDL grammar where the backend can
(``hf:`` models that have one, ``openai:`` servers with ``--grammar``), as the role model does —
so CoT reasons in one free-text call and then writes the spec under the grammar in a second.
ToT's breadth, beam and thought length are options. On transfer tasks (ProntoQA, NATURAL PLAN)
each baseline answers with its own method (``answer_texts``): CoT reasons then answers, ToT
searches over thoughts, Self-Refine answers then revises from its own critique, LLM+P (a route to
a planner, which a free-text benchmark has not) answers under its fixed assumptions.

Baselines see what the loop's prompts carry: the task's NL text and family, and for revisions the
latest spec and diagnostic. They never see references. No baseline has a Judge.

In the domain-given mode (the task comes with its domain; the loop passes ``domains=``) every
baseline shows the domain and writes only the problem: LLM+P as Liu et al. (2023) ran it (the
domain file given, an example problem and its problem PDDL, then the new problem's NL), CoT reasons
about objects, init and goal, ToT's stages become objects, then init and goal, and Self-Refine
revises the problem. The demonstration is then the Actor's of that mode (its task with its domain
given, its problem as the answer), and the spec-writing calls pass the given domains to the
backend (``chat(..., domains=)``), which decodes them under the problem-only grammar.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from omtr.inference import prompts as P
from omtr.inference.backends import Backend
from omtr.policy import Generation, Messages, Sampling

log = logging.getLogger(__name__)

_EDITOR = re.compile(r"^Task:\n(?P<nl>.*?)\n\nPDDL written for it:\n(?P<spec>.*)\n\nThe planner rejected it"
                     r"(?: \((?P<cat>[a-z_]+)\))?: (?P<diag>.*)\n\nWrite the corrected domain and problem in full\.$",
                     re.DOTALL)
_EDITOR_GIVEN = re.compile(r"^Given domain:\n(?P<domain>.*?)\n\nTask:\n(?P<nl>.*?)\n\nProblem written for it:\n"
                           r"(?P<spec>.*)\n\nThe planner rejected it(?: \((?P<cat>[a-z_]+)\))?: (?P<diag>.*)"
                           r"\n\nWrite the corrected problem in full\.$", re.DOTALL)


@dataclass(frozen=True)
class Turn:
    """What the loop's prompt says: the task, and for a revision the latest spec and diagnostic."""

    role: str
    nl: str
    family: str | None = None
    spec: str | None = None
    category: str | None = None
    diagnostic: str | None = None
    domain: str | None = None  # the given domain (domain-given mode): the answer is a problem alone


def read_prompt(role: str, messages: Messages) -> Turn:
    """The task (and, for the Editor, the latest spec and diagnostic) in one of the loop's prompts;
    in the domain-given mode also the given domain."""
    users = [m["content"] for m in messages if m["role"] == "user"]
    if role == "actor":
        family = None
        if len(users) >= 2:
            demo_nl = P.split_given(users[0])[0]
            family = next((f for f, d in P.DEMOS.items() if d.nl == demo_nl), None)
        nl, domain = P.split_given(users[-1]) if users else ("", None)
        return Turn("actor", nl, family, domain=domain)
    m = _EDITOR.match(users[-1]) if users else None
    if m is not None:
        return Turn("editor", m["nl"], None, m["spec"], m["cat"], m["diag"])
    m = _EDITOR_GIVEN.match(users[-1]) if users else None
    if m is None:
        raise ValueError("not an Editor prompt of omtr.inference.prompts.editor_messages")
    return Turn("editor", m["nl"], None, m["spec"], m["cat"], m["diag"], m["domain"])


SYSTEM = ("You translate planning tasks written in English into PDDL: a domain (define (domain ...)) and "
          "a problem (define (problem ...)) that a classical planner can solve.")

COT_INSTRUCTIONS = (
    "First think step by step: list the kinds of objects, the predicates that describe a state, the "
    "actions with their preconditions and effects, the initial state and the goal. Then write the "
    "complete PDDL domain followed by the complete PDDL problem, each as one (define ...) block."
)

SYSTEM_GIVEN = ("You translate planning tasks written in English into a PDDL problem (define (problem ...)) for a "
                "given PDDL domain, one that a classical planner can solve with that domain.")

COT_GIVEN_INSTRUCTIONS = (
    "First think step by step: list the objects of the task with their types, the initial state and the "
    "goal, in the given domain's predicates. Then write the complete PDDL problem for this domain as one "
    "(define (problem ...)) block."
)

LLMP_ASSUMPTIONS = (
    "Assumptions: use STRIPS PDDL (with :typing if you declare types); every object of the task is "
    "declared in :objects; the initial state lists every fact that holds at the start; facts not "
    "listed are false; the goal is a conjunction of facts; actions change only what their effects "
    "say; one action happens at a time."
)


COT_REASON = (
    "Think step by step: list the kinds of objects, the predicates that describe a state, the actions "
    "with their preconditions and effects, the initial state and the goal. Do not write PDDL yet."
)
COT_GIVEN_REASON = (
    "Think step by step: list the objects of the task with their types, the initial state and the goal, "
    "in the given domain's predicates. Do not write PDDL yet."
)

TRANSFER_SYSTEM = "You solve reasoning and planning problems stated in English and give the answer the task asks for."
TRANSFER_COT = "Think step by step, then give the final answer in the form the task asks for."
TRANSFER_STAGE = "Write the next step of reasoning toward the answer."
TRANSFER_CRITIQUE = ("Check your answer against every fact and constraint of the task. Then give the corrected "
                     "final answer in full, in the form the task asks for.")


def demo_messages(family: str | None, *, given: bool = False, domain: str | None = None) -> Messages:
    """The family's demonstration as the Actor sees it: the task, then its PDDL; ``given`` (the
    domain-given mode): the task with its domain given, then its problem alone, in ``domain``'s
    vocabulary where the Actor's prompt shows it so (:func:`omtr.inference.prompts.demo_for`)."""
    demo = P.demo_for(family, domain if given else None)
    if given:
        return [{"role": "user", "content": P.with_domain(demo.nl, demo.domain)},
                {"role": "assistant", "content": demo.problem}]
    return [{"role": "user", "content": demo.nl}, {"role": "assistant", "content": demo.answer}]


def _takes_domains(backend) -> bool:
    try:
        params = inspect.signature(backend.chat).parameters
    except (TypeError, ValueError):
        return False
    return "domains" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class _BaselinePolicy:
    """Shared plumbing: read the loop's prompts, remember each task's family and sample count.

    ``grammar``: decode spec-writing calls under omtr's PDDL grammar where the backend can (the
    default, as the role model does); reasoning and rating calls are free text."""

    name = "baseline"
    uses_judge = False

    def __init__(self, backend: Backend, *, seed: int = 0, temperature: float = 0.7, grammar: bool = True):
        self.backend, self.seed, self.temperature, self.grammar = backend, seed, temperature, grammar
        self._family: dict[str, str | None] = {}
        self._samples: dict[str, int] = {}

    def spec_chat(self, messages: list[Messages], sampling: Sampling, stop_when=None,
                  domains: Sequence[str | None] | None = None) -> list[Generation]:
        """A spec-writing call: under the PDDL grammar unless switched off. ``domains[i]``: prompt i's
        given domain, whose answer is a problem alone (the backend's problem-only grammar)."""
        if not self.grammar:
            return self.backend.chat(messages, sampling, stop_when=stop_when, grammar=False)
        if domains is None or not any(domains):
            return self.backend.chat(messages, sampling, stop_when=stop_when, grammar=True)
        if not _takes_domains(self.backend):
            # its grammar would be the full spec's, which a problem alone never completes
            if not getattr(self, "_warned_domains", False):
                log.warning("%s takes no given domains (chat(..., domains=)): problems for given domains are "
                            "written without the grammar", getattr(self.backend, "name", type(self.backend).__name__))
                self._warned_domains = True
            return self.backend.chat(messages, sampling, stop_when=stop_when, grammar=False)
        return self.backend.chat(messages, sampling, stop_when=stop_when, grammar=True, domains=list(domains))

    def answer_texts(self, nls: list[str], sampling: Sampling) -> list[str]:
        """Transfer tasks answered with this baseline's method (free text, no grammar)."""
        msgs = [[{"role": "system", "content": TRANSFER_SYSTEM}, {"role": "user", "content": nl}] for nl in nls]
        return [g.text for g in self.backend.chat(msgs, sampling)]

    # the Policy protocol
    def judge(self, prompts: Sequence[Messages]) -> list[float]:
        return [0.5] * len(prompts)  # no Judge; the loop is run with judge=False

    def generate(self, role: str, prompts: Sequence[Messages], sampling: Sampling, *,
                 stop_when: Callable[[str], bool] | None = None,
                 domains: Sequence[str | None] | None = None) -> list[Generation]:
        turns = [read_prompt(role, p) for p in prompts]
        if domains is not None:  # the loop's given domains are the authority
            if len(domains) != len(turns):
                raise ValueError(f"{len(turns)} prompts but {len(domains)} given domains")
            turns = [dataclasses.replace(t, domain=d or None) for t, d in zip(turns, domains)]
        for t in turns:
            if t.role == "actor":
                self._family[t.nl] = t.family
                self._samples[t.nl] = 0
        return self.turn(turns, sampling, stop_when)

    def family(self, t: Turn) -> str | None:
        return t.family if t.role == "actor" else self._family.get(t.nl)

    def sampling_for(self, t: Turn, sampling: Sampling) -> Sampling:
        """Sample k of a task: the first as the run asks (greedy in evaluation), then sampled with a
        seed per k (the same for every task, so one sample index is one batched backend call)."""
        k = self._samples.get(t.nl, 0)
        self._samples[t.nl] = k + 1
        if k == 0:
            return sampling
        return Sampling(greedy=False, temperature=self.temperature, top_p=sampling.top_p,
                        max_new_tokens=sampling.max_new_tokens, seed=(self.seed + 7919 * k) % (2**31))

    def _chat_each(self, messages: list[Messages], samplings: list[Sampling], stop_when,
                   domains: Sequence[str | None] | None = None) -> list[Generation]:
        """Group prompts by sampling so the backend batches what it can."""
        out: list[Generation | None] = [None] * len(messages)
        groups: dict[Sampling, list[int]] = {}
        for i, s in enumerate(samplings):
            groups.setdefault(s, []).append(i)
        for s, idx in groups.items():
            gens = self.spec_chat([messages[i] for i in idx], s, stop_when=stop_when,
                                  domains=None if domains is None else [domains[i] for i in idx])
            for i, g in zip(idx, gens):
                out[i] = g
        return out  # type: ignore[return-value]

    def turn(self, turns: list[Turn], sampling: Sampling, stop_when) -> list[Generation]:
        raise NotImplementedError


class IndependentSamples(_BaselinePolicy):
    """K independent samples of one prompt per task (CoT, LLM+P)."""

    def messages(self, t: Turn) -> Messages:
        raise NotImplementedError

    def turn(self, turns, sampling, stop_when):
        return self._chat_each([self.messages(t) for t in turns], [self.sampling_for(t, sampling) for t in turns],
                               stop_when, [t.domain for t in turns])


class CoT(IndependentSamples):
    """Chain of thought, one-shot: reason, then write the spec (under the grammar in a second call)."""

    name = "cot"

    def __init__(self, backend: Backend, *, reasoning_tokens: int = 256, **kw):
        super().__init__(backend, **kw)
        self.reasoning_tokens = reasoning_tokens

    def messages(self, t: Turn) -> Messages:
        if t.domain:
            return [{"role": "system", "content": SYSTEM_GIVEN}, *demo_messages(self.family(t), given=True, domain=t.domain),
                    {"role": "user", "content": f"{t.nl}\n\nThe domain:\n{t.domain}\n\n{COT_GIVEN_INSTRUCTIONS}"}]
        return [{"role": "system", "content": SYSTEM}, *demo_messages(self.family(t)),
                {"role": "user", "content": f"{t.nl}\n\n{COT_INSTRUCTIONS}"}]

    def reason_messages(self, t: Turn) -> Messages:
        if t.domain:
            return [{"role": "system", "content": SYSTEM_GIVEN}, *demo_messages(self.family(t), given=True, domain=t.domain),
                    {"role": "user", "content": f"{t.nl}\n\nThe domain:\n{t.domain}\n\n{COT_GIVEN_REASON}"}]
        return [{"role": "system", "content": SYSTEM}, *demo_messages(self.family(t)),
                {"role": "user", "content": f"{t.nl}\n\n{COT_REASON}"}]

    def turn(self, turns, sampling, stop_when):
        if not self.grammar:  # reasoning and spec in one free-text answer
            return super().turn(turns, sampling, stop_when)
        samplings = [self.sampling_for(t, sampling) for t in turns]
        out: list[Generation | None] = [None] * len(turns)
        groups: dict[Sampling, list[int]] = {}
        for i, s in enumerate(samplings):
            groups.setdefault(s, []).append(i)
        for s, idx in groups.items():
            think = Sampling(greedy=s.greedy, temperature=s.temperature, top_p=s.top_p, seed=s.seed,
                             max_new_tokens=min(self.reasoning_tokens, s.max_new_tokens))
            reasons = self.backend.chat([self.reason_messages(turns[i]) for i in idx], think)
            msgs = [self.reason_messages(turns[i]) + [
                {"role": "assistant", "content": r.text.strip()},
                {"role": "user", "content": "Now write the complete PDDL problem for the given domain." if turns[i].domain
                 else "Now write the complete PDDL domain followed by the complete PDDL problem."}]
                for i, r in zip(idx, reasons)]
            specs = self.spec_chat(msgs, s, stop_when=stop_when, domains=[turns[i].domain for i in idx])
            for i, r, g in zip(idx, reasons, specs):
                g.text = f"{r.text.strip()}\n\n{g.text}"  # the trace keeps the reasoning; extraction reads the PDDL
                out[i] = g
        return out  # type: ignore[return-value]

    def answer_texts(self, nls, sampling):
        msgs = [[{"role": "system", "content": TRANSFER_SYSTEM}, {"role": "user", "content": f"{nl}\n\n{TRANSFER_COT}"}]
                for nl in nls]
        return [g.text for g in self.backend.chat(msgs, sampling)]


class LLMPlusP(IndependentSamples):
    name = "llm+p"

    def answer_texts(self, nls, sampling):
        msgs = [[{"role": "system", "content": TRANSFER_SYSTEM + " " + LLMP_ASSUMPTIONS},
                 {"role": "user", "content": nl}] for nl in nls]
        return [g.text for g in self.backend.chat(msgs, sampling)]

    def messages(self, t: Turn) -> Messages:
        demo = P.demo_for(self.family(t), t.domain)
        if t.domain:  # Liu et al.'s setting: the domain file given, an example problem and its problem file
            return [
                {"role": "system", "content": SYSTEM_GIVEN + " " + LLMP_ASSUMPTIONS},
                {"role": "user", "content": f"The domain:\n{demo.domain}\n\nAn example problem:\n{demo.nl}"},
                {"role": "assistant", "content": demo.problem},
                {"role": "user", "content": f"The domain:\n{t.domain}\n\nNow this problem:\n{t.nl}\n\n"
                                            "Write its PDDL problem file for this domain directly, without further explanation."},
            ]
        return [
            {"role": "system", "content": SYSTEM + " " + LLMP_ASSUMPTIONS},
            {"role": "user", "content": f"An example problem:\n{demo.nl}"},
            {"role": "assistant", "content": demo.answer},
            {"role": "user", "content": f"Now this problem:\n{t.nl}\n\nWrite its PDDL domain and problem."},
        ]


class SelfRefine(_BaselinePolicy):
    """Write a spec, then revise it from the planner's diagnostic and its category (no trained roles, greedy)."""

    name = "self-refine"

    def __init__(self, backend: Backend, *, refine_rounds: int = 1, **kw):
        super().__init__(backend, **kw)
        self.refine_rounds = refine_rounds  # transfer tasks: self-critique rounds (no planner to ask)

    def messages(self, t: Turn) -> Messages:
        if t.domain:
            ask = f"{t.nl}\n\nThe domain:\n{t.domain}\n\nWrite the PDDL problem for this domain."
            first = [{"role": "system", "content": SYSTEM_GIVEN}, *demo_messages(self.family(t), given=True, domain=t.domain),
                     {"role": "user", "content": ask}]
            if t.role == "actor":
                return first
            kind = f" ({t.category})" if t.category else ""
            return first + [
                {"role": "assistant", "content": t.spec or ""},
                {"role": "user", "content": f"The planner rejected it{kind}:\n{t.diagnostic}\n\n"
                                            "Revise your problem so the planner accepts it; write the problem in full."},
            ]
        first = [{"role": "system", "content": SYSTEM}, *demo_messages(self.family(t)),
                 {"role": "user", "content": f"{t.nl}\n\nWrite the PDDL domain and problem."}]
        if t.role == "actor":
            return first
        kind = f" ({t.category})" if t.category else ""
        return first + [
            {"role": "assistant", "content": t.spec or ""},
            {"role": "user", "content": f"The planner rejected it{kind}:\n{t.diagnostic}\n\n"
                                        "Revise your PDDL so the planner accepts it; write the domain and problem in full."},
        ]

    def turn(self, turns, sampling, stop_when):
        return self.spec_chat([self.messages(t) for t in turns], sampling, stop_when=stop_when,
                              domains=[t.domain for t in turns])

    def answer_texts(self, nls, sampling):
        msgs = [[{"role": "system", "content": TRANSFER_SYSTEM}, {"role": "user", "content": nl}] for nl in nls]
        answers = [g.text for g in self.backend.chat(msgs, sampling)]
        for _ in range(self.refine_rounds):
            msgs = [m + [{"role": "assistant", "content": a}, {"role": "user", "content": TRANSFER_CRITIQUE}]
                    for m, a in zip(msgs, answers)]
            answers = [g.text for g in self.backend.chat(msgs, sampling)]
            msgs = [m[:2] for m in msgs]
        return answers


STAGES = (
    "Stage 1: list the kinds of objects (types) and every object of the task with its type.",
    "Stage 2: list the predicates that describe a state, and each action with its parameters, "
    "preconditions and effects.",
)
# With a given domain only the problem is written: its objects, then its initial state and goal.
STAGES_GIVEN = (
    "Stage 1: list every object of the task with its type from the given domain.",
    "Stage 2: list the facts of the initial state and of the goal, in the given domain's predicates.",
)


class ToT(_BaselinePolicy):
    """Breadth-first tree of thoughts with the model as evaluator; at most K final specs."""

    name = "tot"

    def __init__(self, backend: Backend, *, seed: int = 0, breadth: int = 2, beam: int = 2, budget: int = 6,
                 thought_tokens: int = 160, temperature: float = 0.7, grammar: bool = True):
        super().__init__(backend, seed=seed, temperature=temperature, grammar=grammar)
        for label, v in (("breadth", breadth), ("beam", beam), ("thought length", thought_tokens)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ToT's {label} must be a whole number of at least 1, got {v!r}")
        self.breadth, self.beam, self.budget, self.thought_tokens = breadth, beam, budget, thought_tokens
        self._queue: dict[str, list[str]] = {}  # the surviving reasoning states per task, best first
        self._domain: dict[str, str | None] = {}  # nl -> the given domain (domain-given mode)
        self.tree: dict[str, list[tuple[float, str]]] = {}  # the final beam per task (for traces and tests)

    def _task_text(self, nl: str) -> str:
        domain = self._domain.get(nl)
        return f"{nl}\n\nThe domain:\n{domain}" if domain else nl

    def _thought_prompt(self, nl: str, state: str, stage: str) -> Messages:
        done = f"\n\nAnalysis so far:\n{state}" if state else ""
        return [{"role": "system", "content": SYSTEM_GIVEN if self._domain.get(nl) else SYSTEM},
                {"role": "user", "content": f"{self._task_text(nl)}{done}\n\n{stage} Be brief."}]

    def _value_prompt(self, nl: str, state: str) -> Messages:
        return [{"role": "system", "content": "You grade analyses of planning tasks."},
                {"role": "user", "content": f"Task:\n{nl}\n\nAnalysis:\n{state}\n\nHow correct and complete is this "
                                            "analysis for writing the task in PDDL? Answer with one number from 1 to 10."}]

    @staticmethod
    def _rating(text: str) -> float:
        m = re.search(r"\b(10|[1-9])\b", text)
        return float(m.group(1)) if m else 5.0

    def search(self, nls: list[str], sampling: Sampling,
               stages: Sequence[str] | None = None) -> dict[str, list[tuple[float, str]]]:
        """Breadth-first over the stages for several tasks at once; the surviving (rating, state) beams.

        ``stages``: the same for every task (transfer answers); by default a task's PDDL stages
        (:data:`STAGES`, or :data:`STAGES_GIVEN` when its domain is given)."""
        beams = {nl: [(0.0, "")] for nl in nls}
        for depth in range(len(stages or STAGES)):
            prompts, owners = [], []
            for nl in nls:
                stage = (stages or (STAGES_GIVEN if self._domain.get(nl) else STAGES))[depth]
                for _, state in beams[nl]:
                    for b in range(self.breadth):
                        prompts.append(self._thought_prompt(nl, state, stage))
                        owners.append((nl, state, b))
            # one seed per branch index, so siblings differ and each branch is one batched call
            thoughts: list[Generation | None] = [None] * len(prompts)
            for b in range(self.breadth):
                idx = [i for i, o in enumerate(owners) if o[2] == b]
                s = Sampling(greedy=False, temperature=self.temperature, top_p=sampling.top_p,
                             max_new_tokens=min(self.thought_tokens, sampling.max_new_tokens),
                             seed=(self.seed + 1000 * depth + b) % (2**31))
                for i, g in zip(idx, self.backend.chat([prompts[i] for i in idx], s)):
                    thoughts[i] = g
            children = [(nl, (state + "\n" + g.text.strip()).strip()) for (nl, state, _), g in zip(owners, thoughts)]  # type: ignore[union-attr]
            values = self.backend.chat([self._value_prompt(nl, st) for nl, st in children],
                                       Sampling(greedy=True, max_new_tokens=4))
            scored: dict[str, list[tuple[float, str]]] = {nl: [] for nl in nls}
            for (nl, st), v in zip(children, values):
                scored[nl].append((self._rating(v.text), st))
            beams = {nl: sorted(scored[nl], key=lambda x: -x[0])[: self.beam] for nl in nls}
        return beams

    def turn(self, turns, sampling, stop_when):
        for t in turns:
            if t.role == "actor" or t.domain:
                self._domain[t.nl] = t.domain
        fresh = [t.nl for t in turns if t.role == "actor"]
        if fresh:
            beams = self.search(fresh, sampling)
            for nl in fresh:
                self.tree[nl] = beams[nl]
                self._queue[nl] = [st for _, st in beams[nl]] or [""]
                self._samples[nl] = 0
        # final spec j of a task is written from state j mod beam (best state first), on demand: a
        # task solved by its first final spec costs no more
        slots: list[int] = []
        for t in turns:
            j = self._samples.get(t.nl, 0)
            self._samples[t.nl] = j + 1
            slots.append(j)
        out: list[Generation | None] = [None] * len(turns)
        for j in sorted(set(slots)):
            idx = [i for i, sj in enumerate(slots) if sj == j]
            s = sampling if j == 0 else Sampling(
                greedy=False, temperature=self.temperature, top_p=sampling.top_p,
                max_new_tokens=sampling.max_new_tokens, seed=(self.seed + 100 + j) % (2**31))
            msgs = []
            for i in idx:
                states = self._queue.get(turns[i].nl) or [""]
                msgs.append(self._final_prompt(turns[i].nl, states[j % len(states)]))
            given = [self._domain.get(turns[i].nl) for i in idx]
            for i, g in zip(idx, self.spec_chat(msgs, s, stop_when=stop_when, domains=given)):
                out[i] = g
        return out  # type: ignore[return-value]

    def _final_prompt(self, nl: str, state: str) -> Messages:
        if self._domain.get(nl):
            return [{"role": "system", "content": SYSTEM_GIVEN}, *demo_messages(self._family.get(nl), given=True, domain=self._domain.get(nl)),
                    {"role": "user", "content": f"{self._task_text(nl)}\n\nAnalysis:\n{state}\n\nUsing this analysis, "
                                                "write the complete PDDL problem for the given domain."}]
        return [{"role": "system", "content": SYSTEM}, *demo_messages(self._family.get(nl)),
                {"role": "user", "content": f"{nl}\n\nAnalysis:\n{state}\n\nUsing this analysis, write the complete "
                                            "PDDL domain followed by the complete PDDL problem."}]

    def answer_texts(self, nls, sampling):
        beams = self.search(list(nls), sampling, stages=(TRANSFER_STAGE, TRANSFER_STAGE))
        msgs = [[{"role": "system", "content": TRANSFER_SYSTEM},
                 {"role": "user", "content": f"{nl}\n\nReasoning:\n{(beams[nl] or [(0, '')])[0][1]}\n\n"
                                             "Using this reasoning, give the final answer in the form the task asks for."}]
                for nl in nls]
        return [g.text for g in self.backend.chat(msgs, sampling)]


BASELINES = {"cot": CoT, "tot": ToT, "llm+p": LLMPlusP, "self-refine": SelfRefine}
ALIASES = {"llmp": "llm+p", "llm-p": "llm+p", "self-refine+solver": "self-refine", "selfrefine": "self-refine",
           "self_refine": "self-refine"}


def baseline(name: str, backend: Backend, **options) -> _BaselinePolicy:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in BASELINES:
        raise KeyError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    cls = BASELINES[key]
    if cls is not ToT:
        for k in ("budget", "breadth", "beam", "thought_tokens"):
            options.pop(k, None)
    return cls(backend, **options)
