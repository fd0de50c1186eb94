"""Scoped decoding: a spec may only name what it has declared.

The PDDL grammar (:mod:`omtr.model.grammar`) is context-free: it knows what a predicate *looks*
like, not which predicates exist. :class:`ScopeTracker` reads the answer written so far, one
character at a time, and keeps what the spec has declared: requirement flags, types and their
parents, predicates with their argument types, actions, each action's parameters, objects, and
the literals already written in each conjunction. From that it decides which names may come next:

* a predicate in a precondition, an effect, ``:init`` or ``:goal`` is one the domain declared,
  with exactly its arity (the character after its name says how many arguments follow);
* an argument is one of the action's parameters (in an action) or a declared object or constant
  (in the problem), whose type fits the predicate's parameter (a subtype fits);
* a type in a typed list is a declared type or ``object``;
* nothing is declared twice, no literal repeats inside one conjunction or ``:init``;
* ``-`` (typing), ``(not`` in a precondition or goal and ``(=`` need the flags that allow them;
* a parameter list or ``:objects`` closes only when some predicate can be written with what it
  declared (an action's effect and the goal need at least one literal).

The constraint comes from the answer itself, in the domain-given mode from the given domain, and,
when the caller passes them (``objects``), from the task's statement, read from the English alone
(:mod:`omtr.statement`), never from a reference: the object names it uses and, with them, its facts
and the predicates its clauses name. Nothing else here reads the task's text.

One tracker, the rules split by concern, each in a file named after it:

* :mod:`.tracker`: :class:`ScopeTracker`, reading the answer into frames and combining the rules;
  :mod:`.frames`: the frames it reads into, :class:`Reject`, :data:`WORD_CHARS`;
* :mod:`.declarations`: the declarations rule above (``scope``), :class:`Declared`, the given domain;
* :mod:`.names`: the statement's names rule (``statement_objects``): the problem's ``:objects``;
* :mod:`.facts`: the statement's facts rule (``statement_facts``): the atoms of ``:init`` and the
  goal, with the predicates rule (``statement_predicates``);
* :mod:`.statics`: the static facts ``:init`` may hold beside the statement's facts.

How it is applied (:func:`omtr.model.grammar.scoped_tokens`): xgrammar computes the grammar's token
mask; the tracker then removes the tokens it rejects. Inside a name whose allowed values are a
finite set (declared predicates, parameters, objects, types, flags), the admitted tokens are found
by walking the allowed names through a table of the tokenizer's pieces; elsewhere only the few
tokens the grammar admits that cross a word boundary are simulated character by character.
"""

from .declarations import Declared, GivenDomainError, declared_from_domain, given_declarations
from .frames import WORD_CHARS, Reject
from .tracker import ScopeTracker

__all__ = ["WORD_CHARS", "Declared", "GivenDomainError", "Reject", "ScopeTracker", "declared_from_domain",
           "given_declarations"]
