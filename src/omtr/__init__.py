"""omtr: one model, three roles (Actor, Judge, Editor) for natural-language planning to PDDL."""

__version__ = "0.1.0"
