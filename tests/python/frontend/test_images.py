"""Images from Python against PIL and transformers (the project's .venv; skipped where they
are not installed): mt.data.read_image decodes as PIL's convert("RGB"), mt.data.ImageProcessor
gives ViTImageProcessor's pixel_values, and a ViT-GPT2 captioner initialized in Python gives
transformers' VisionEncoderDecoderModel logits and loss on the folder it saves, and captions
as its greedy decoding does."""
import os

import numpy as np
import pytest
import torch

import meshtrain as mt
from conftest import max_err

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
PHOTOS = "/usr/lib/python3/dist-packages/sklearn/datasets/images"


def photo_files(tmp_path):
    """The two sklearn photographs (JPEG) and PNGs of other modes and sizes made from them."""
    files = [os.path.join(PHOTOS, n) for n in ("china.jpg", "flower.jpg")]
    if not all(map(os.path.exists, files)):
        pytest.skip("python3-sklearn's sample photographs are not installed")
    im = Image.open(files[0])
    for mode, size in (("RGBA", (97, 61)), ("L", (40, 75)), ("P", (64, 64))):
        path = str(tmp_path / f"{mode}.png")
        im.resize(size).convert(mode).save(path)
        files.append(path)
    return files


def test_read_image_and_processor_equal_pil_and_vit_image_processor(report, tmp_path):
    files = photo_files(tmp_path)
    images = [mt.data.read_image(f) for f in files]
    for f, a in zip(files, images):
        assert np.array_equal(a, np.asarray(Image.open(f).convert("RGB"))), f
    with open(files[0], "rb") as fh:
        assert np.array_equal(mt.data.decode_image(fh.read()), images[0])

    hf = transformers.ViTImageProcessor(size={"height": 48, "width": 40}, resample=3,
                                        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    hf.save_pretrained(str(tmp_path / "proc"))
    ours = mt.data.ImageProcessor.from_pretrained(str(tmp_path / "proc"))
    assert ours.size == (48, 40) and ours.resample == "bicubic"
    want = hf([Image.open(f).convert("RGB") for f in files], return_tensors="np")["pixel_values"]
    got = ours(images)
    assert tuple(got.shape) == want.shape == (len(files), 3, 48, 40)
    # transformers rounds through float32 where PIL hands it uint8: within 1/255 after normalizing.
    assert report("pixel_values", max_err(got, want)) <= 1.0 / 255 / 0.224
    with pytest.raises(mt.Error, match=r"image 0 must be \(height, width, 3\)"):
        ours([np.zeros((4, 4), np.uint8)])
    with pytest.raises(mt.Error, match="missing.png"):
        mt.data.read_image(str(tmp_path / "missing.png"))


def test_captioner_logits_loss_and_captions_equal_transformers(report, tmp_path):
    config = mt.models.small_config("vision-encoder-decoder", 40, 16, 2)
    config["encoder"].update(hidden_size=32, num_hidden_layers=2, intermediate_size=64)
    config["decoder"].update(n_embd=32, n_layer=2)
    model, params = mt.models.init_model(config, mt.random.key(3))
    pixels = np.random.default_rng(0).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)
    labels = np.array([[5, 9, 11, 2], [7, 3, 2, -100]])
    decoder = np.array([[2, 5, 9, 11], [2, 7, 3, 2]])
    logits = model.apply(params, pixel_values=mt.array(pixels), decoder_input_ids=mt.array(decoder))
    loss = model.loss(params, labels=mt.array(labels), pixel_values=mt.array(pixels), decoder_input_ids=mt.array(decoder))
    captions = model.generate(params, pixel_values=mt.array(pixels), max_new_tokens=6)

    model.save_pretrained(params, str(tmp_path / "captioner"))
    hf = transformers.VisionEncoderDecoderModel.from_pretrained(str(tmp_path / "captioner")).eval()
    with torch.no_grad():
        out = hf(pixel_values=torch.tensor(pixels), decoder_input_ids=torch.tensor(decoder))
        want_loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), torch.tensor(labels).flatten(),
                                                      ignore_index=-100)
        # Greedy decoding step by step from the start token (transformers' generate() does not
        # import under this torch 1.13 on Python 3.11).
        seq = torch.full((2, 1), config["decoder_start_token_id"])
        for _ in range(6):
            seq = torch.cat([seq, hf(pixel_values=torch.tensor(pixels), decoder_input_ids=seq).logits[:, -1:].argmax(-1)], 1)
    assert report("vit-gpt2 logits", max_err(logits, out.logits)) <= 1e-5
    assert report("vit-gpt2 loss", max_err(loss, want_loss)) <= 1e-5
    for ours, theirs in zip(captions, seq[:, 1:].tolist()):
        end = theirs.index(2) + 1 if 2 in theirs else len(theirs)
        assert ours == theirs[:end]
    with pytest.raises(mt.Error, match="pixel_values"):
        model.generate(params, [[1, 2]])


def test_captioner_lora_covers_cross_attention_and_peft_loads_it(report, tmp_path):
    peft = pytest.importorskip("peft")
    config = mt.models.small_config("vision-encoder-decoder", 40, 16, 2)
    config["encoder"].update(hidden_size=32, num_hidden_layers=2, intermediate_size=64)
    config["decoder"].update(n_embd=32, n_layer=2)
    model, params = mt.models.init_model(config, mt.random.key(3))
    adapted, lora = model.add_lora(params, rank=4, alpha=8.0, key=mt.random.key(5))
    cross = [k for k in lora if "crossattention" in k and "lora_" in k]
    assert sorted({k.split(".")[-3] for k in cross}) == ["c_attn", "c_proj", "q_attn"]
    # B starts at zero; random B makes every adapter count.
    rng = np.random.default_rng(1)
    lora = {k: mt.array(rng.normal(0, 0.2, tuple(v.shape)).astype(np.float32)) if "lora_B" in k else v
            for k, v in lora.items()}
    model.save_pretrained(params, str(tmp_path / "base"))
    adapted.save_adapter(lora, str(tmp_path / "adapter"), base_model=str(tmp_path / "base"))
    pixels = rng.uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)
    decoder = np.array([[2, 5, 9, 11], [2, 7, 3, 2]])
    ours = adapted.apply(lora, pixel_values=mt.array(pixels), decoder_input_ids=mt.array(decoder))
    base = transformers.VisionEncoderDecoderModel.from_pretrained(str(tmp_path / "base")).eval()
    with torch.no_grad():
        plain = base(pixel_values=torch.tensor(pixels), decoder_input_ids=torch.tensor(decoder)).logits
        theirs = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()(
            pixel_values=torch.tensor(pixels), decoder_input_ids=torch.tensor(decoder)).logits
    assert max_err(ours, plain) > 0.1  # the adapters change the output
    assert report("vit-gpt2 LoRA logits vs peft", max_err(ours, theirs)) <= 1e-5
    # Only cross-attention adapters: still equal.
    only_cross = {k: (v if "crossattention" in k or "lora_" not in k else v * 0.0) for k, v in lora.items()}
    again = adapted.apply(only_cross, pixel_values=mt.array(pixels), decoder_input_ids=mt.array(decoder))
    assert max_err(again, plain) > 1e-3
