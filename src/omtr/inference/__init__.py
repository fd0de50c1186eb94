"""The episode loop: the Policy contract it talks to, the three roles' prompts, extraction of specs
from model text, scripted policies and baselines, selection among candidates; `omtr infer`."""
