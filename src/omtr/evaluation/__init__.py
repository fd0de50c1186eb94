"""Evaluation under a planner-call budget: harness policies, metrics, figures and reports.

Evaluation code may read references (faithfulness, oracle and mutant checks); nothing here feeds
training. ``omtr evaluate`` (``omtr.cli.evaluate``) is the command line; the pieces:

* :mod:`omtr.evaluation.harness` — ``oracle``, ``mutant:<kind>``, ``file:PATH`` policies;
* :mod:`omtr.evaluation.run` — one evaluation into a folder (traces, episode log, metrics, report);
* :mod:`omtr.evaluation.traces` — the folder's file names and the trace file's reader, shared by run and report;
* :mod:`omtr.evaluation.metrics` — the paper's tables from traces, with bootstrap intervals;
* :mod:`omtr.evaluation.report` — PNG figures, ``report.html``, comparisons in HTML and Markdown.
"""
