"""`omtr model export`: the role model's files in standard formats, loaded by the standard tools.

A micro model (random tiny Qwen2, its own tokenizer) whose LoRA weights are set to random values
(fresh LoRA adapters are zero, so a merge would change nothing and prove nothing). peft loads the
exported adapters with ``PeftModel.from_pretrained``; transformers loads each merged folder and,
given the role's vectors before the prompt's embeddings as ``inputs_embeds``, decodes greedily the
same tokens as the role model's own ``generate``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

PROMPT = [{"role": "system", "content": "Write PDDL."}, {"role": "user", "content": "Put block a on block b."}]
TOKENS = 12


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from omtr.model import build_model

    tmp = tmp_path_factory.mktemp("export")
    rm = build_model("micro")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in rm.lm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model_dir = rm.save(tmp / "model")
    r = subprocess.run([sys.executable, "-m", "omtr", "-q", "model", "export", str(model_dir),
                        "--peft", str(tmp / "peft"), "--merged", str(tmp / "merged")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert set(json.loads(r.stdout[r.stdout.rindex("\n{") + 1:] if "\n{" in r.stdout else r.stdout)) == {"peft", "merged"}
    return model_dir, tmp / "peft", tmp / "merged"


def _role_model(model_dir):
    from omtr.model.roles import RoleModel

    return RoleModel.load(model_dir, device="cpu")


def _with_role_vectors(model, tok, vectors):
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok(ids, add_special_tokens=False)["input_ids"]])
    emb = model.get_input_embeddings()(ids)
    return torch.cat([vectors.to(emb.dtype).unsqueeze(0), emb], dim=1)


@pytest.mark.parametrize("role", ["actor", "editor"])
def test_peft_loads_the_saved_adapters(exported, role):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, peft_dir, _ = exported
    cfg = json.loads((peft_dir / role / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] > 0
    base = AutoModelForCausalLM.from_pretrained(peft_dir / "backbone")
    tok = AutoTokenizer.from_pretrained(peft_dir / "backbone")
    model = PeftModel.from_pretrained(base, peft_dir / role).eval()
    rm = _role_model(model_dir)
    i = rm.use_role(role)
    embeds = _with_role_vectors(model, tok, rm.role_embeddings[i].detach())
    with torch.no_grad():
        got = model(inputs_embeds=embeds).logits
        want = rm.lm(inputs_embeds=embeds).logits
        with model.disable_adapter():
            plain = model(inputs_embeds=embeds).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-3)  # the adapter is really there and changes the answer


@pytest.mark.parametrize("role", ["actor", "editor"])
def test_merged_export_generates_what_the_role_model_generates(exported, role):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omtr.policy import Sampling

    model_dir, _, merged = exported
    folder = merged / role
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert not any("lora_" in n for n, _ in model.named_parameters())  # a plain model
    tok = AutoTokenizer.from_pretrained(folder)
    vectors = load_file(str(folder / "role_vectors.safetensors"))["role_vectors"]
    rm = _role_model(model_dir)
    (gen,) = rm.generate(role, [PROMPT], Sampling(greedy=True, max_new_tokens=TOKENS), grammar=False)
    embeds = _with_role_vectors(model, tok, vectors)
    with torch.no_grad():
        out = model.generate(inputs_embeds=embeds, attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long),
                             max_new_tokens=TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
    hf = [t for t in out[0].tolist() if t != tok.eos_token_id]
    assert gen.token_ids and hf == [t for t in gen.token_ids if t != tok.eos_token_id]
    # without the role vectors the merged weights are a different policy (what a token-only runtime gets)
    ids = _with_role_vectors(model, tok, vectors[:0])
    with torch.no_grad():
        plain = model(inputs_embeds=ids).logits[0, -1]
        full = model(inputs_embeds=embeds).logits[0, -1]
    assert not torch.allclose(plain, full, atol=1e-4)


def test_export_refuses_a_non_empty_folder(exported, tmp_path):
    model_dir, _, merged = exported
    r = subprocess.run([sys.executable, "-m", "omtr", "model", "export", str(model_dir), "--merged", str(merged)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "exists and is not empty" in r.stderr + r.stdout
