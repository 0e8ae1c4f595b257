"""The Hugging Face side of each row: BertForMaskedLM / EncoderDecoderModel (BertModel +
BertLMHeadModel) with their own losses, torch.optim.AdamW, and `generate`."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import torch
import transformers

torch.set_num_threads(int(os.environ.get("B2B_BENCH_TORCH_THREADS", "2")))


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).astype(np.int64))


def load(folder: str) -> torch.nn.Module:
    from safetensors.torch import load_file

    with open(os.path.join(folder, "hf_config.json")) as f:
        meta = json.load(f)
    if meta["kind"] == "masked-lm":
        model = transformers.BertForMaskedLM(transformers.BertConfig(**meta["encoder"]))
    else:
        cfg = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(
            transformers.BertConfig(**meta["encoder"]), transformers.BertConfig(**meta["decoder"]))
        model = transformers.EncoderDecoderModel(config=cfg)
    missing, unexpected = model.load_state_dict(load_file(os.path.join(folder, "hf.safetensors")), strict=False)
    missing = [k for k in missing if "position_ids" not in k]
    if missing or unexpected:
        raise RuntimeError(f"Weights do not fit the HF model: missing {missing[:5]}, unexpected {unexpected[:5]}.")
    return model


class Side:
    name = "hf"

    def __init__(self, inputs: dict[str, np.ndarray]):
        self.x = inputs
        self.model = None
        self.info = {"framework": f"torch {torch.__version__}, transformers {transformers.__version__}",
                     "threads": torch.get_num_threads()}

    # -- training ------------------------------------------------------------------------------
    def train_setup(self, task: str, folder: str) -> dict:
        x = self.x
        model = self.model = load(folder)
        if task == "mlm":
            self.kwargs = dict(input_ids=_t(x["mlm_inputs"]), attention_mask=_t(x["mlm_mask"]), labels=_t(x["mlm_hf_labels"]))
        else:
            tgt = x["ft_tgt"]
            labels = tgt[:, 1:].astype(np.int64)
            labels[labels == 0] = -100  # padding is not scored (b2b: weight 0)
            self.kwargs = dict(input_ids=_t(x["ft_src"]), attention_mask=_t(x["ft_mask"]),
                               decoder_input_ids=_t(tgt[:, :-1]), labels=torch.from_numpy(labels))
        model.eval()
        with torch.no_grad():
            check = float(model(**self.kwargs).loss)
        model.train()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if attn is None and hasattr(model, "encoder"):
            attn = model.encoder.config._attn_implementation
        return {"eval_loss": check, "attn_implementation": attn}

    def train_step(self) -> dict:
        t = time.perf_counter()
        loss = self.model(**self.kwargs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        return {"seconds": time.perf_counter() - t, "loss": value}

    def teardown(self) -> None:
        self.model = self.optimizer = self.kwargs = None

    # -- generation ----------------------------------------------------------------------------
    def gen_setup(self, folder: str) -> dict:
        self.model = load(folder).eval()
        return {"attn_implementation": self.model.encoder.config._attn_implementation}

    def generate(self, rows: list[int], beams: int, max_new_tokens: int) -> dict:
        ids, lengths = self.x["gen_ids"][rows], self.x["gen_lengths"][rows]
        ids = ids[:, : int(lengths.max())]
        mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
        t = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=_t(ids), attention_mask=torch.from_numpy(mask), decoder_start_token_id=101, eos_token_id=102,
                pad_token_id=0, max_new_tokens=max_new_tokens, num_beams=beams, do_sample=False,
                early_stopping=True, length_penalty=1.0, no_repeat_ngram_size=0)
        seconds = time.perf_counter() - t
        tokens = []
        for row in out.tolist():
            row = row[1:]  # drop the decoder start token
            tokens.append(row[: row.index(102)] if 102 in row else row)  # unfinished rows are not padded
        return {"seconds": seconds, "tokens": tokens}

    # -- matmul peak ---------------------------------------------------------------------------
    def matmul(self, m: int, k: int, n: int, repeats: int) -> dict:
        a, b = torch.randn(m, k), torch.randn(k, n)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
        return {"gflops": 2 * m * k * n / best / 1e9}
