"""Models and tokenizers from Python against Hugging Face transformers and tokenizers (the
project's .venv; skipped where they are not installed): the tiny HF checkpoints of
../shared/data load with their tokenizers, give transformers' logits, loss and greedy ids,
and save_pretrained writes folders transformers loads."""
import os

import numpy as np
import pytest
import torch

import meshtrain as mt
from conftest import max_err

transformers = pytest.importorskip("transformers")
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "data", "models")
GPT2 = os.path.join(DATA, "hf-tiny-gpt2")
BERT = os.path.join(DATA, "hf-tiny-bert")
TEXTS = ["Hello world, this is meshtrain.", "A second, longer sentence with café and 123 numbers."]


def test_gpt2_logits_loss_and_greedy_ids_equal_transformers(report, tmp_path):
    model, params = mt.models.from_pretrained(GPT2)
    assert model.model_type == "gpt2" and "transformer.wte.weight" in params
    hf_tok = transformers.AutoTokenizer.from_pretrained(GPT2)
    ids = [model.tokenizer.encode(t) for t in TEXTS]
    assert ids == [hf_tok(t)["input_ids"] for t in TEXTS]
    assert model.tokenizer.decode(ids[1]) == TEXTS[1]

    hf = transformers.AutoModelForCausalLM.from_pretrained(GPT2).eval()
    x = np.array(ids[0], dtype=np.int64)[None]
    logits = model.apply(params, mt.array(x))
    labels = mt.array(x)
    loss = model.loss(params, mt.array(x), labels)
    with torch.no_grad():
        out = hf(torch.tensor(x), labels=torch.tensor(x))
    assert report("gpt2 logits", max_err(logits, out.logits)) <= 1e-5
    assert report("gpt2 loss", max_err(loss, out.loss)) <= 1e-5

    new = model.generate(params, [ids[0]], max_new_tokens=8)
    # transformers' greedy decoding, step by step (its generate() does not import under this
    # torch 1.13 on Python 3.11).
    seq = torch.tensor(x)
    with torch.no_grad():
        for _ in range(8):
            nxt = hf(seq).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    hf_ids = seq[0, x.shape[1]:].tolist()
    assert len(new[0]) >= 1 and new[0] == hf_ids[:len(new[0])]

    # Parameters changed in Python go back out through save_pretrained.
    changed = dict(params)
    changed["transformer.ln_f.bias"] = params["transformer.ln_f.bias"] + 0.5
    model.save_pretrained(changed, str(tmp_path / "out"))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    with torch.no_grad():
        again = back(torch.tensor(x)).logits
    assert report("saved gpt2 logits", max_err(model.apply(changed, mt.array(x)), again)) <= 1e-5


def test_gpt2_gradients_through_a_python_loss(report):
    model, params = mt.models.from_pretrained(GPT2)
    x = np.array([model.tokenizer.encode(TEXTS[0])], dtype=np.int64)
    value, grads = mt.value_and_grad(lambda p: model.loss(p, mt.array(x), mt.array(x)))(params)
    hf = transformers.AutoModelForCausalLM.from_pretrained(GPT2)
    out = hf(torch.tensor(x), labels=torch.tensor(x))
    out.loss.backward()
    named = dict(hf.named_parameters())
    worst = 0.0
    for name in ("transformer.h.0.mlp.c_fc.weight", "transformer.h.0.ln_1.weight", "transformer.wpe.weight"):
        g = named[name].grad
        worst = max(worst, max_err(grads[name], g) / max(1.0, float(g.abs().max())))
    assert report("gpt2 gradients (relative to max |g|)", worst) <= 1e-4


def test_bert_hidden_states_equal_transformers(report):
    model, params = mt.models.from_pretrained(BERT)
    hf_tok = transformers.AutoTokenizer.from_pretrained(BERT)
    tok = mt.Tokenizer.from_file(BERT)
    assert tok.encode_batch(TEXTS) == [hf_tok(t)["input_ids"] for t in TEXTS]
    ids = np.array([tok.encode(TEXTS[0])], dtype=np.int64)
    got = model.apply(params, mt.array(ids))
    # The checkpoint's architecture decides the head meshtrain loads: vocabulary logits for an
    # LM head, else the encoder's hidden states; transformers' matching class is the reference.
    lm_head = got.shape[-1] == hf_tok.vocab_size
    hf_class = transformers.BertForMaskedLM if lm_head else transformers.BertModel
    hf = hf_class.from_pretrained(BERT).eval()
    with torch.no_grad():
        out = hf(torch.tensor(ids))
    want = out.logits if lm_head else out.last_hidden_state
    assert report("bert " + ("logits" if lm_head else "hidden"), max_err(got, want)) <= 1e-5


def test_errors_name_the_path():
    with pytest.raises(mt.Error, match="no-such-dir"):
        mt.models.from_pretrained("/tmp/no-such-dir")


def test_tokenizer_truncation_and_padding_equal_transformers():
    path = os.path.join(DATA, "..", "tokenizers", "bert-base-uncased-tokenizer.json")
    tok = mt.Tokenizer.from_file(path)
    tok.enable_truncation(12)
    tok.enable_padding(length=12)
    texts = ["short one", "a considerably longer sentence that will certainly be cut somewhere", ""]
    ids, mask = tok.encode_batch_with_mask(texts)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=path, pad_token="[PAD]")
    want = hf(texts, truncation=True, max_length=12, padding="max_length")
    assert ids == want["input_ids"] and mask == want["attention_mask"]
    # Each batch to its longest row, rounded up to a multiple (DataCollatorWithPadding's way).
    tok.enable_truncation(64)
    tok.enable_padding(pad_to_multiple_of=8)
    ids, mask = tok.encode_batch_with_mask(texts)
    want = hf(texts, truncation=True, max_length=64, padding="longest", pad_to_multiple_of=8)
    assert ids == want["input_ids"] and mask == want["attention_mask"]
    assert len(ids[0]) == 16  # the longest row has 12 tokens


def test_lora_trains_only_adapters_and_peft_loads_them(report, tmp_path):
    """add_lora, a few Trainer steps with mt.optim.lora, save_adapter; PEFT applies the adapter
    to transformers' model and gives meshtrain's logits."""
    peft = pytest.importorskip("peft")
    base, params = mt.models.from_pretrained(GPT2)
    model, lp = base.add_lora(params, rank=2, alpha=4.0, key=mt.random.key(3))
    adapters = [k for k in lp if "lora_" in k]
    assert adapters and len(lp) == len(params) + len(adapters)
    x = np.array([base.tokenizer.encode(TEXTS[1])], dtype=np.int64)
    assert max_err(model.apply(lp, mt.array(x)), np.asarray(base.apply(params, mt.array(x)))) == 0  # B = 0

    examples = [{"ids": x[0]}] * 8
    trainer = mt.Trainer(mt.Deployer(workdir=str(tmp_path / "run"), device="cpu", verbose=False),
                         lambda rows: {"ids": np.stack([r["ids"] for r in rows])},
                         lambda p, b, key, training: model.loss(p, b["ids"], b["ids"]), lp,
                         mt.optim.lora(mt.optim.adamw(1e-1)))
    trainer.fit(examples, per_device_batch_size=4, epochs=2, progress=False)
    trained = trainer.params
    changed = [k for k in lp if not np.array_equal(np.asarray(trained[k]), np.asarray(lp[k]))]
    assert changed and all("lora_" in k for k in changed), changed

    model.save_adapter(trained, str(tmp_path / "adapter"), base_model=GPT2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(GPT2)
    with_adapter = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        want = with_adapter(torch.tensor(x)).logits
    assert report("peft logits", max_err(model.apply(trained, mt.array(x)), want)) <= 1e-5
    merged_model, merged = model.merge_lora(trained)
    assert not any("lora_" in k for k in merged)
    assert report("merged logits", max_err(merged_model.apply(merged, mt.array(x)), want)) <= 1e-5


def test_llama2c_checkpoint_loads_generates_and_exports_to_transformers(report, tmp_path):
    """stories260K (llama2.c's format, GQA) from Python: loaded, generating, and exported to a
    Hugging Face folder that transformers' LLaMA gives the same logits for."""
    path = os.path.join(DATA, "stories260K", "stories260K.bin")
    model, params = mt.models.from_pretrained(path)
    assert model.model_type == "llama"
    prompt = [1, 403, 407, 261, 378]
    ids = model.generate(params, [prompt], max_new_tokens=12)[0]
    assert len(ids) >= 1 and ids == model.generate(params, [prompt], max_new_tokens=12)[0]
    model.save_pretrained(params, str(tmp_path / "hf"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    x = np.array([prompt + ids], dtype=np.int64)
    with torch.no_grad():
        want = hf(torch.tensor(x)).logits
    assert report("stories260K logits", max_err(model.apply(params, mt.array(x)), want)) <= 1e-4
    # Greedy: each generated id is the argmax after the tokens before it.
    assert want[0, len(prompt) - 1:-1].argmax(-1).tolist()[:len(ids)] == ids


def test_a_cli_run_and_its_checkpoint_load_as_its_model_folder(tmp_path):
    """from_pretrained takes what the CLI's generate, eval and serve take: a run directory or a
    checkpoint, besides the run's exported model/ folder."""
    import subprocess
    cli = os.path.join(os.environ.get("MT_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "..", "build")),
                       "apps", "meshtrain", "meshtrain")
    if not os.path.exists(cli):
        pytest.fail(f"{cli} is not built")
    run = tmp_path / "run"
    text = os.path.join(DATA, "..", "text", "tinyshakespeare.txt")
    r = subprocess.run([cli, "pretrain", "--data", text, "--seq-len", "32", "--steps", "2", "--sample-every", "0",
                        "--eval-fraction", "0.005", "--output-dir", str(run)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ids = mt.array([[1, 2, 3, 4]])
    model, params = mt.models.from_pretrained(str(run / "model"))
    want = np.asarray(model.apply(params, ids))
    for path in (run, run / "checkpoints" / "step_00000002"):
        m, p = mt.models.from_pretrained(str(path))
        assert max_err(m.apply(p, ids), want) == 0, path
