"""The trainer's typed configuration: every learning-signal number of the paper is a default here.

``TrainConfig`` is one frozen dataclass; every field has a default and a help string, and
``__post_init__`` rejects combinations that cannot work with a sentence that says how to fix them.
Profiles (``micro``, ``small``, ``paper``) are instances; ``--config FILE`` (JSON or YAML) and
``--set key=value`` change single fields (:meth:`TrainConfig.with_overrides`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omtr.config import UPDATE_DTYPES, ConfigError, EpisodeConfig
from omtr.rl.rewards import BROKEN_CREDIT, GROUNDING_WEIGHT, UNGROUNDED_CREDIT
from omtr.rollout import PREFIX_CACHE_MB

_EP = EpisodeConfig()


def _f(default, help: str, **kw):
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class TrainConfig:
    """Multi-role RL from planner feedback (PPO for Actor and Editor, the Judge's calibrated loss)."""

    profile: str = _f("paper", "Name of the profile these values started from (informational).")
    model: str = _f("small", "Model directory or profile (micro, small, paper) the run starts from.")
    device: str | None = _f(None, "torch device (cpu, cuda, ...); None: the model profile's choice.")
    seed: int = _f(0, "Seed of data order, sampling and every random choice of the trainer.")
    torch_threads: int | None = _f(None, "torch CPU threads (None: torch's default; 1 suits tiny models on busy machines).")

    # ---------------------------------------------------------------- schedule / rollout
    cycles: int = _f(8, "Cycles of rollout -> update (paper: 8).")
    updates_per_cycle: int = _f(16, "Batches (one PPO update each) per cycle; tasks per cycle = "
                                    "updates_per_cycle x episodes_per_batch / samples_per_task.")
    episodes_per_batch: int = _f(32, "Episodes rolled out per update (paper: 32).")
    samples_per_task: int = _f(1, "Episodes sampled per task in one batch (the group of the `group` estimator).")
    dynamic_sampling: bool = _f(False, "Train only on groups whose samples' returns differ (a group with equal returns "
                                       "has zero group advantages) and roll out replacement tasks for the others (DAPO).")
    dynamic_sampling_rounds: int = _f(3, "With dynamic_sampling: rollout rounds per update at most (the first plus "
                                         "replacements); an update trains on the groups with signal it found.")
    curriculum: bool = _f(False, "Admit tasks by object count (meta n_objects), smallest first; the cap rises one "
                                 "level when the rollouts of tasks at the cap succeed at curriculum_advance_at (a success "
                                 "the reward counts in full: under nontrivial, not one with an empty plan).")
    curriculum_start: int = _f(2, "With curriculum: the first cap on a task's object count.")
    curriculum_advance_at: float = _f(0.5, "With curriculum: rollout success rate at the cap that raises it.")
    max_repairs: int = _f(_EP.max_repairs, "H_max: Editor turns after the Actor's spec; K = H_max + 1 planner calls.")
    temperature: float = _f(_EP.train_temperature, "Sampling temperature of rollouts (paper: 0.7).")
    top_p: float = _f(1.0, "Nucleus mass of rollouts; 1.0 keeps the PPO ratio exact.")
    max_new_tokens: int = _f(768, "Token limit of one Actor/Editor answer.")
    rollout_batch_size: int | None = _f(None, "Episodes generated together (none: all that wait; the small profile: 8, "
                                              "one task's samples, which bounds the rollout's keys, values and Judge "
                                              "batch in memory).")
    rollout_engine: str = _f("hf", "Rollout engine (omtr.rollout): hf (the policy itself, exact) or fast (CPU: merged "
                                   "adapters, int8 linears; the old log-probs are then recomputed by the policy).")
    prefix_cache: bool = _f(True, "The fast engine's prefix cache across rollout prompts (Actor, Editor and Judge "
                                  "prompts of a family computed once; dropped after every optimizer step).")
    prefix_cache_mb: float = _f(PREFIX_CACHE_MB, "The prefix cache's bound in MiB (least recently used blocks go first).")
    lean_prefix_cache_mb: float = _f(64.0, "With lean_memory: the prefix cache's bound in MiB for training's engines "
                                            "where lower than prefix_cache_mb (the cache changes how fast a prompt is "
                                            "computed, never its values: the blocks are the same chunks either way).")
    grammar: bool | None = _f(None, "PDDL grammar during rollouts (None: the model's setting).")
    decoding: str | None = _f(None, "Decoding constraint of rollouts: scoped, plain or off (None: the model's; "
                                    "see ModelConfig.decoding). When set it decides over `grammar` (scoped/plain "
                                    "turn the grammar on). Saved with the trained model.")
    grammar_limits: dict | None = _f(None, "Bounds of the grammar's repetitions, e.g. {\"actions\": 4} (None: the model's; "
                                           "see ModelConfig.grammar_limits). Saved with the trained model.")

    # ---------------------------------------------------------------- rewards
    reward: str = _f("binary", "Outcome score of a verdict, by name: binary (the paper: success 1, else 0) "
                               "nontrivial (binary, but a solved spec with an empty plan scores 0: its goal "
                               "already holds), shaped (how far up the diagnostic ladder the spec got) or grounded "
                               "(half nontrivial, half how well the problem's atoms line up with the facts the "
                               "task's English states; never a reference); see omtr.rl.rewards.")
    judge_reward_weight: float = _f(_EP.judge_reward_weight, "R_A = b0 + w * s_J (paper: 0.3).")
    grounding_weight: float = _f(GROUNDING_WEIGHT, "Under reward=grounded: score = (1 - w) * nontrivial + w * grounding (the F1 of "
                                      "the task's stated facts against the problem's atoms, omtr.rl.grounding).")
    broken_credit: float = _f(BROKEN_CREDIT, "Under reward=supported: the score of a solved spec whose initial state breaks "
                                             "one of the domain's mutex invariants (0: none; 1: nontrivial).")
    grounding_support: bool = _f(True, "Under reward=supported: where the task's statement is read, an unbroken solved spec "
                                       "scores 1 only when its atoms state the English's clauses one to one (typed "
                                       "grounding 1); below, ungrounded_credit * typed grounding. false: the invariants alone.")
    ungrounded_credit: float = _f(UNGROUNDED_CREDIT, "Under reward=supported: the most a solved, unbroken spec whose atoms do not state "
                                                     "the English's clauses one to one scores (times its typed grounding).")
    agreement_weight: float = _f(0.0, "Under reward=supported: the share w of a supported spec's score that comes from "
                                      "agreement with the task's other samples, (1 - w) + w * share (0: off).")
    judge_target: str = _f("score", "What the Judge learns to predict: score (the Actor spec's outcome score is 1: "
                                    "under reward=supported, solved with the signals' support) or verdict (the "
                                    "planner's bare acceptance, the paper).")
    collapse_guards: bool = _f(True, "Log per update the largest semantic cluster's share of a task's samples, clusters "
                                     "per task and how often a task's largest cluster changes (needs samples_per_task > 1; "
                                     "the equivalence checks cost about a second a task).")
    judge_gate_auc: float = _f(0.0, "s_J enters R_A only while the Judge's AUC (success vs failure) over the last "
                                    "judge_gate_window updates' Actor specs is above this; 0: always (the paper).")
    judge_gate_window: int = _f(3, "Updates the Judge gate looks back over.")
    judge_negatives: int = _f(0, "For each Actor spec the Judge learns as accepted, this many mutants of it as negatives "
                                 "(omtr.rl.negatives: an atom under another predicate, an object the English never "
                                 "names, an atom left out; the spec's own text with one edit, no reference read). "
                                 "0: off (the paper's Judge sees the rollouts' specs only).")
    judge_items_per_update: int = _f(0, "Train L_J on at most this many of the batch's Actor specs, balanced between "
                                        "accepted and rejected (0: all of them, the paper).")
    limited_reward: str = _f("zero", "Reward of a verdict decided by a limit (time, memory): zero (b = 0, the paper's "
                                     "appendix B.1) or skip (no reward, the step is not trained on).")
    editor_step_penalty: float = _f(_EP.editor_step_penalty, "R_E = b_T - c * T (paper: 0.1).")
    editor_gamma: float = _f(0.9, "Discount crediting R_E back across refinement steps (paper: 0.9).")
    judge_threshold: float = _f(0.5, "tau of the thresholded Judge reward (logged, appendix A.4).")

    # ---------------------------------------------------------------- losses
    advantage: str = _f("gae", "Advantage estimator by name: gae (learned value baseline) or group "
                               "(group mean over samples_per_task samples of a task, GRPO-style).")
    gae_lambda: float = _f(0.95, "lambda of GAE across refinement steps.")
    whiten_advantages: bool = _f(True, "Whiten advantages per role over the batch (a spread below 1e-3 is only "
                                       "centred; with advantage=group, False keeps each group's own scale).")
    group_scale: bool = _f(True, "group: divide by the group's standard deviation (GRPO).")
    ppo_clip: float = _f(0.2, "PPO clip epsilon (paper: 0.2).")
    kl_coef: float = _f(0.0, "KL penalty to the reference policy (k3 estimator). The paper's objective has no KL "
                             "term, so 0 (off) is its setting; > 0 adds one and runs the reference pass.")
    actor_weight: float = _f(1.0, "Weight of L_PPO^A in the joint loss.")
    editor_weight: float = _f(0.5, "Weight of L_PPO^E in the joint loss (paper: 0.5).")
    judge_weight: float = _f(0.3, "Weight of L_J in the joint loss (paper: 0.3).")
    band_weight: float = _f(0.5, "lambda_band: weight of the Judge's band penalty inside L_J.")
    value_weight: float = _f(0.5, "Weight of the value head's squared error (gae only).")

    # ---------------------------------------------------------------- optimisation
    lr: float = _f(3e-5, "Adam learning rate (paper: 3e-5).")
    value_lr: float = _f(1e-3, "Adam learning rate of the value head (a linear map on frozen features).")
    adam_betas: tuple[float, float] = _f((0.9, 0.999), "Adam betas.")
    weight_decay: float = _f(0.0, "Adam weight decay.")
    max_grad_norm: float = _f(1.0, "Gradient-norm clip (0: off).")
    ppo_epochs: int = _f(1, "Passes over one batch.")
    minibatches: int = _f(1, "Optimizer steps per pass (the batch is split in this many parts).")
    micro_batch_size: int = _f(4, "Sequences per forward/backward (memory); gradients accumulate.")
    activation_checkpointing: bool | None = _f(None, "Recompute the decoder layers' activations in the backward pass of "
                                                     "the update instead of keeping them (None: the model's; see "
                                                     "ModelConfig.activation_checkpointing, on by default). Saved with the model.")
    checkpoint_layers: float | None = _f(None, "With activation checkpointing, the share of decoder layers that "
                                               "recompute their activations (None: the model's; see "
                                               "ModelConfig.checkpoint_layers). Saved with the model.")
    judge_checks: bool | None = _f(None, "The Judge's prompt shows the annotation-free checks against the spec (None: the "
                                         "model's; see ModelConfig.judge_checks, on by default). Saved with the model.")
    logprob_chunk: int | None = _f(None, "Completion positions whose vocabulary-wide logits exist at once in the old "
                                         "log-probs, reference and PPO passes (None: the model's; see "
                                         "ModelConfig.logprob_chunk, 512 by default); 0 computes the whole micro-batch's "
                                         "logits at once (the earlier path, several GB on SmolLM2). Saved with the model.")
    reuse_first_logprobs: bool = _f(True, "With a non-exact rollout engine (fast): the steps of the update's first "
                                          "optimizer step take their PPO 'old' log-probs from that step's own forward "
                                          "pass (the parameters have not moved yet, so the values are the same) "
                                          "instead of a separate pass; false recomputes every step's beforehand.")
    pack_rows: bool | None = _f(None, "The training passes' rows packed without padding over their shared prompt prefix "
                                      "(None: the model's; see ModelConfig.pack_rows, on by default); false is the "
                                      "left-padded batch. Saved with the model.")
    fused_adapters: bool | None = _f(None, "The LoRA layers' product, scale and sum as one addmm (None: the model's; "
                                           "see ModelConfig.fused_adapters, on by default); false is peft's own "
                                           "forward pass. Saved with the model.")
    judge_micro_batch_size: int | None = _f(None, "Judge prompts per forward/backward pass in the update (None: "
                                                   "micro_batch_size). Each Judge prompt is a whole spec with its "
                                                   "checks, so a micro-batch of them holds more than the Actor's; the "
                                                   "small profile's 2 keeps the update's peak memory lower at about "
                                                   "the same speed.")
    prompt_prefix_once: bool = _f(True, "In the old-log-prob pass and in each optimizer step of the update, a "
                                        "prompt prefix shared by several micro-batches (a task's samples) goes "
                                        "through the network once, its gradient summed over the micro-batches "
                                        "(torch backend; DeepSpeed computes it per micro-batch); false computes "
                                        "it once per micro-batch, as before.")
    update_dtype: str = _f("fp32", "Number format of the old-log-prob, reference and update passes: fp32, bf16 (a bf16 "
                                   "autocast of the matrix products and attention; weights, gradients, optimizer, LM "
                                   "head and losses stay fp32) or auto (the small profile's: bf16 where the device "
                                   "has it natively and, on a CPU, a probe of one product finds it at least 1.15x "
                                   "faster than fp32; fp32 elsewhere, with an info line saying why: these 2-core "
                                   "Xeons have avx512_bf16 but compute fp32 faster). An explicit bf16 without native "
                                   "bf16 falls back to fp32 with one log line.")
    huge_pages: bool = _f(True, "torch's CPU blocks of 2 MiB and more on transparent huge pages (torch's "
                                "THP_MEM_ALLOC_ENABLE, read at its first allocation: omtr train sets it from this "
                                "setting before it imports torch; a value in the environment decides). Fewer page "
                                "faults for the passes' fresh blocks; changes no value.")
    lean_heap_mb: float = _f(32.0, "With lean_memory: in the passes that train (old log-probs, PPO, Judge) blocks "
                                   "under this many MiB come from glibc's heap, trimmed after each micro-batch "
                                   "(fresh pages for every mid-sized block of a micro-batch cost more than its "
                                   "products); 1 or less gives every block of 1 MiB or more pages of its own, as "
                                   "before 2026-12-07. Changes no value.")
    lean_memory: bool = _f(True, "Between phases, hand memory that no later computation reads back to the system: the "
                                 "rollout engine's prefix cache after the rollout (stale once the update moves the "
                                 "parameters; a refresh would drop it anyway) and glibc's free heap pages "
                                 "(malloc_trim) after the rollout and after the update; glibc's mmap threshold fixed "
                                 "at 1 MiB in the rollout and in the passes that train (larger blocks, the rollout's "
                                 "keys and values among them, are returned when freed; 32 MiB between; "
                                 "omtr.rl.memory); the fast engine's prefix cache bounded by lean_prefix_cache_mb. "
                                 "Changes no value; false keeps the earlier behaviour.")
    memory_phases: bool = _f(True, "Log each update's resident memory by phase: at each phase's end and the process's "
                                   "high-water mark then (mem_<phase>_end_mb, mem_<phase>_hwm_mb, mem_hwm_mb; "
                                   "omtr.rl.memory).")
    memory_sample_ms: float = _f(0.0, "With memory_phases: also sample the resident set every this many ms on a thread "
                                      "for each phase's own peak (mem_<phase>_peak_mb); 0: no thread (a thread waking "
                                      "often slows torch on a machine whose cores are all busy).")

    # ---------------------------------------------------------------- ablations (paper Table 4)
    use_judge: bool = _f(True, "False: no Judge (no s_J in R_A, no L_J).")
    use_editor: bool = _f(True, "False: no Editor (one planner call per episode, no L_E).")
    separate_models: bool = _f(False, "Three separate backbones, one per role, instead of one shared.")
    frozen_backbone: bool | None = _f(None, "True freezes the backbone, False trains it; None: the model's setting.")

    # ---------------------------------------------------------------- environment
    solver_workers: int = _f(1, "Planner worker processes of the local pool.")
    solver_time_limit_s: float = _f(60.0, "Planner CPU limit per call (paper: 60 s).")
    solver_memory_mb: int = _f(4096, "Planner memory limit per call.")

    # ---------------------------------------------------------------- bookkeeping
    checkpoint_every_updates: int = _f(0, "Also checkpoint every K updates (0: once per cycle only).")
    keep_checkpoints: int = _f(2, "Checkpoints kept on disk (the newest ones).")
    save_model_every_cycle: bool = _f(True, "Write RUN/model (a model directory) at every cycle's end.")
    validate_logs: bool = _f(True, "Validate every episode log before the update that uses it.")
    mlflow: bool = _f(True, "Log to MLflow (tracking URI from the environment, default ./mlruns.db).")
    experiment: str = _f("omtr-train", "MLflow experiment name.")
    metrics_port: int | None = _f(None, "Serve Prometheus /metrics on this port (needs the fleet extra).")
    deepspeed: str | None = _f(None, "DeepSpeed config JSON; None trains with plain torch.")

    def __post_init__(self) -> None:
        from omtr.rl.advantages import ADVANTAGE_ESTIMATORS
        from omtr.rl.rewards import OUTCOME_SCORES

        if self.decoding is not None:
            from omtr.config import DECODING_CONSTRAINTS

            if self.decoding not in DECODING_CONSTRAINTS:
                raise ConfigError(f"decoding {self.decoding!r}: choose one of {', '.join(DECODING_CONSTRAINTS)} "
                                  "(e.g. --set decoding=plain)")
        if self.grammar_limits is not None:
            from omtr.config import ModelConfig

            ModelConfig(grammar_limits=dict(self.grammar_limits))  # the same check as the model's

        from omtr.rollout import UnknownEngine, check_engine_name

        try:
            check_engine_name(self.rollout_engine)
        except UnknownEngine as exc:
            raise ConfigError(f"{exc} (e.g. --set rollout_engine=fast)") from None
        if self.update_dtype not in UPDATE_DTYPES:
            raise ConfigError(f"update_dtype {self.update_dtype!r}: choose one of {', '.join(UPDATE_DTYPES)} "
                              "(e.g. --set update_dtype=fp32)")
        model_settings = {k: v for k, v in (("logprob_chunk", self.logprob_chunk),
                                             ("checkpoint_layers", self.checkpoint_layers)) if v is not None}
        if model_settings:
            from omtr.config import ModelConfig

            ModelConfig(**model_settings)  # the same checks as the model's
        if self.prefix_cache_mb < 0:
            raise ConfigError(f"prefix_cache_mb must be 0 or more, got {self.prefix_cache_mb} "
                              "(0 keeps nothing; --set prefix_cache=false turns the cache off)")
        if self.lean_prefix_cache_mb < 0:
            raise ConfigError(f"lean_prefix_cache_mb must be 0 or more, got {self.lean_prefix_cache_mb}")
        if not 0 <= self.lean_heap_mb <= 32:
            raise ConfigError(f"lean_heap_mb must be between 0 and 32 (glibc's ceiling for its mmap threshold), "
                              f"got {self.lean_heap_mb}")
        pos = ("cycles", "updates_per_cycle", "episodes_per_batch", "samples_per_task", "max_new_tokens",
               "ppo_epochs", "minibatches", "micro_batch_size", "solver_workers", "dynamic_sampling_rounds",
               "judge_gate_window")
        for name in pos:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        optional = {"judge_micro_batch_size": "unset: micro_batch_size",  # sizes that may be None: what None means
                    "rollout_batch_size": "--set rollout_batch_size=none generates all of a batch's episodes together"}
        for name, unset in optional.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ConfigError(f"{name} must be at least 1 (or {unset}), got {value}")
        if self.episodes_per_batch % self.samples_per_task:
            raise ConfigError(f"episodes_per_batch ({self.episodes_per_batch}) must be a multiple of "
                              f"samples_per_task ({self.samples_per_task}): a batch holds whole groups")
        if self.minibatches > self.episodes_per_batch:
            raise ConfigError("minibatches cannot exceed episodes_per_batch; lower minibatches")
        if self.advantage not in ADVANTAGE_ESTIMATORS:
            raise ConfigError(f"advantage {self.advantage!r} is unknown; choose one of {sorted(ADVANTAGE_ESTIMATORS)}")
        if self.advantage == "group" and self.samples_per_task < 2:
            raise ConfigError("the group estimator needs several samples of a task: set samples_per_task >= 2 "
                              "(e.g. --set samples_per_task=4), or use advantage=gae")
        if self.dynamic_sampling and self.samples_per_task < 2:
            raise ConfigError("dynamic_sampling compares the samples of a task: set samples_per_task >= 2 "
                              "(e.g. --set samples_per_task=8), or --set dynamic_sampling=false")
        if self.limited_reward not in ("zero", "skip"):
            raise ConfigError(f"limited_reward {self.limited_reward!r}: choose zero (the paper) or skip")
        if not 0 <= self.judge_gate_auc < 1:
            raise ConfigError(f"judge_gate_auc must be in [0, 1), got {self.judge_gate_auc} (0: no gate)")
        if not 0 < self.curriculum_advance_at <= 1:
            raise ConfigError(f"curriculum_advance_at must be in (0, 1], got {self.curriculum_advance_at}")
        if self.reward not in OUTCOME_SCORES:
            raise ConfigError(f"reward {self.reward!r} is unknown; choose one of {sorted(OUTCOME_SCORES)}")
        if self.max_repairs < 0:
            raise ConfigError("max_repairs must be >= 0 (0: the Actor's spec only)")
        if not self.temperature > 0:
            raise ConfigError("temperature must be positive: PPO needs sampled rollouts (paper: 0.7)")
        if not 0 < self.top_p <= 1:
            raise ConfigError("top_p must be in (0, 1]")
        for name in ("ppo_clip", "kl_coef", "lr", "value_lr", "judge_reward_weight", "editor_step_penalty",
                     "band_weight", "value_weight", "actor_weight", "editor_weight", "judge_weight",
                     "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.judge_target not in ("score", "verdict"):
            raise ConfigError(f"judge_target {self.judge_target!r}: choose score or verdict (the paper's), "
                              "e.g. --set judge_target=verdict")
        for name in ("editor_gamma", "gae_lambda", "judge_threshold", "grounding_weight", "broken_credit", "ungrounded_credit",
                     "agreement_weight"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.judge_negatives < 0:
            raise ConfigError("judge_negatives must be >= 0 (0: no made-up negatives for the Judge)")
        if self.judge_items_per_update < 0:
            raise ConfigError("judge_items_per_update must be >= 0 (0: every Actor spec of the batch)")
        if self.checkpoint_every_updates < 0 or self.keep_checkpoints < 1:
            raise ConfigError("checkpoint_every_updates must be >= 0 and keep_checkpoints >= 1")
        if self.deepspeed is not None and self.separate_models:
            raise ConfigError("deepspeed with separate_models is not supported: run the shared backbone, "
                              "or drop --set deepspeed=...")

    # ---------------------------------------------------------------- derived
    @property
    def budget(self) -> int:
        """K: planner calls per episode."""
        return 1 + (self.max_repairs if self.use_editor else 0)

    @property
    def tasks_per_batch(self) -> int:
        return self.episodes_per_batch // self.samples_per_task

    @property
    def total_updates(self) -> int:
        return self.cycles * self.updates_per_cycle

    # ---------------------------------------------------------------- (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["adam_betas"] = list(self.adam_betas)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown config key(s) {sorted(unknown)}; see `omtr train --help` for the fields")
        d = dict(d)
        if "adam_betas" in d:
            d["adam_betas"] = tuple(float(x) for x in d["adam_betas"])
        return cls(**d)

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def with_overrides(self, pairs: list[str] | None = None, file: str | Path | None = None) -> "TrainConfig":
        """This config with a file's keys (JSON or YAML), then ``key=value`` pairs, applied."""
        changes: dict[str, Any] = {}
        if file is not None:
            text = Path(file).read_text(encoding="utf-8")
            if str(file).endswith((".yaml", ".yml")):
                import yaml

                data = yaml.safe_load(text) or {}
            else:
                data = json.loads(text)
            if not isinstance(data, dict):
                raise ConfigError(f"{file}: expected a mapping of config keys to values")
            changes.update(data)
        types = {f.name: f for f in dataclasses.fields(self)}
        for pair in pairs or []:
            if "=" not in pair:
                raise ConfigError(f"--set {pair!r}: expected key=value, e.g. --set lr=1e-4")
            key, raw = pair.split("=", 1)
            key = key.strip()
            if key not in types:
                raise ConfigError(f"--set {key}: unknown key; known keys: {', '.join(sorted(types))}")
            changes[key] = _parse_value(raw.strip(), getattr(self, key), key)
        d = self.to_dict()
        d.update(changes)
        return TrainConfig.from_dict(d)


def _parse_value(raw: str, current: Any, key: str) -> Any:
    if raw.lower() in ("none", "null"):
        return None
    if isinstance(current, bool) or raw.lower() in ("true", "false"):
        if raw.lower() in ("true", "1", "yes", "on"):
            return True
        if raw.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"--set {key}={raw}: expected true or false")
    if isinstance(current, dict) or raw.startswith("{"):
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise ConfigError(f"--set {key}={raw}: expected a JSON object, e.g. --set {key}='{{\"actions\": 4}}'")
        return value
    if isinstance(current, tuple):
        return tuple(float(x) for x in raw.strip("()[]").split(","))
    for cast in (int, float):
        if isinstance(current, cast) or current is None:
            try:
                return cast(raw)
            except ValueError:
                if isinstance(current, cast):
                    raise ConfigError(f"--set {key}={raw}: expected a number") from None
    return raw


def help_table() -> str:
    """``key (default): help`` for every field, for ``omtr train --help``."""
    base = TrainConfig()
    return "\n".join(f"  {f.name} ({getattr(base, f.name)!r}): {f.metadata['help']}" for f in dataclasses.fields(TrainConfig))


TRAIN_PROFILES: dict[str, TrainConfig] = {
    # The paper's settings: 8 cycles x 16 updates x 32 episodes (4,096 episodes; at ~2.9 planner calls
    # an episode, about 12,000 calls), one shared trainable backbone, PPO with a value baseline.
    "paper": TrainConfig(profile="paper", model="paper", minibatches=4, judge_target="verdict"),
    # The small-model recipe on SmolLM2 (CPU): what moves a 135M model in tens of updates, after trl's
    # GRPO and DAPO. 8 samples of each task at 0.7, advantages normalised within each task's
    # group (no whitening across tasks), groups whose samples all got the same return replaced by
    # fresh tasks (dynamic sampling), two minibatches a batch so the clip acts, no KL term, the
    # Judge's term in R_A only once the Judge separates success from failure (AUC > 0.6) and its loss
    # on 8 balanced Actor specs a batch (a whole prompt's forward and backward each), tasks of
    # up to 2 objects first (the cap rises as the rollouts succeed), the fast rollout engine.
    # LoRA on attention and MLP comes with the `small` model profile. The reward is `nontrivial`:
    # the paper's binary, but a solved spec with an empty plan scores 0 (the untrained model
    # "solves" almost every domain-given task with a spec whose goal already holds, so binary gives
    # every sample of a group the same reward). No Editor turn in training (max_repairs=0): the
    # Actor's reward does not depend on it, and its rollouts and PPO items (each a prompt of its own,
    # spec and diagnostic included) took about half of an update; with 16 Judge items instead of 8
    # an update took ~150 s on a shared 2-core machine, now ~60 s. `--set max_repairs=1` trains the
    # Editor too. 4 updates of 2 tasks x 8 samples by default.
    # The reward is `supported` since issue 35: under `nontrivial` the model learned initial states
    # the planner accepts and no plan of the domain reaches (`(holding b)` beside `(handempty)` for
    # "b is on the table"), raising planner success and lowering faithful success; a solved spec
    # now scores only when its initial state breaks none of the given domain's mutex invariants.
    # Since issue 42: micro-batches of 4 (cut by completion length within a task's samples: less
    # padding, ~0.75 GB less at the peak than 8), the first minibatch's old log-probs from its own
    # forward pass, and the passes that train in bf16 where the CPU has it and computes it faster
    # (update_dtype=auto: fp32 on CPUs whose bf16 products measure slower, as these 2-core Xeons').
    # Since 2026-12-07: Judge micro-batches of 2 and log-probs 256 positions at a time keep the whole
    # `omtr train` under 3 GB with the fp32 update and the attention kept for the recomputation.
    # Since 2026-12-07 (late): the rollout generates 8 episodes at a time (one task's samples, whose prompt
    # is shared): on a 2-core Xeon without bf16 the whole default `omtr train` peaked at 3.11-3.25 GB
    # with all 16 episodes of a batch together, the second rollout setting the peak, and at 2.73 GB
    # with 8; its rollout made 73-74 tokens/s against 80-95.
    # Since issue 41: one mutant of each supported Actor spec as a Judge negative (judge_negatives=1),
    # its prompt showing the checks against it (ModelConfig.judge_checks): under the statement rules
    # every answer is supported, and without them the Judge never sees a negative to learn from.
    "small": TrainConfig(profile="small", model="small", reward="supported", cycles=2, updates_per_cycle=2,
                         episodes_per_batch=16,
                         samples_per_task=8, advantage="group", whiten_advantages=False, dynamic_sampling=True,
                         dynamic_sampling_rounds=2, curriculum=True, curriculum_start=2, curriculum_advance_at=0.5,
                         judge_gate_auc=0.6, judge_items_per_update=8, judge_negatives=1, lr=2e-4, ppo_epochs=1,
                         minibatches=2, kl_coef=0.0,
                         max_repairs=0, max_new_tokens=448, micro_batch_size=4, judge_micro_batch_size=2,
                         logprob_chunk=256,
                         rollout_engine="fast", rollout_batch_size=8,
                         solver_time_limit_s=20.0, solver_memory_mb=2048, frozen_backbone=True,
                         checkpoint_every_updates=0, update_dtype="auto"),
    # Tests: the random micro model, tiny batches, short answers, no planner time to speak of.
    "micro": TrainConfig(profile="micro", model="micro", cycles=2, updates_per_cycle=2, episodes_per_batch=4,
                         max_repairs=1, max_new_tokens=24, micro_batch_size=4, grammar=False,
                         solver_time_limit_s=10.0, solver_memory_mb=1024, mlflow=False, lr=1e-3,
                         save_model_every_cycle=False, torch_threads=1),
}


def train_profile(name: str) -> TrainConfig:
    try:
        return TRAIN_PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown training profile {name!r}; choose one of {sorted(TRAIN_PROFILES)}") from None
