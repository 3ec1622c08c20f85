#!/usr/bin/env python3
"""Write a random-weight Qwen3-MoE checkpoint that SGLang serves, for the GPU rehearsal.

    python3 tools/rehearsal/make_model.py OUT_DIR [--hidden 2048 --layers 8 --experts 32 ...]

The defaults make a 1.8 B-parameter model (3.7 GB in bf16): large enough that one H200 sets the
pace of a prefill-heavy cell (the 58 M-parameter model of the reference recipe left the GPU
under 5% busy). The tensors are drawn on the GPU when there is one and written straight to
`model.safetensors` under Hugging Face's Qwen3-MoE names; no model class is instantiated. A
byte-level BPE tokenizer is trained on generated words (no download). Outputs are nonsense;
shapes, kernels, scheduling and memory behave like a real model of this size.

Needs torch, safetensors, tokenizers and transformers (the GPU machine's image has them). Prints
one JSON line: the folder, parameter count and seconds. An existing complete folder is kept.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(out: Path, vocab: int, seed: int) -> int:
    """Train a byte-level BPE of `vocab` entries on generated words; return its length."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(40000)]
    lines = [" ".join(rng.choices(words, k=48)) + "." for _ in range(6000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=1,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        model_max_length=65536,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return len(fast)


def tensor_shapes(a: argparse.Namespace, vocab: int) -> dict[str, tuple[int, ...]]:
    """Hugging Face Qwen3-MoE parameter names and shapes (no biases, q/k norms, no tying)."""
    hd = a.hidden // a.heads
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, a.hidden),
        "model.norm.weight": (a.hidden,),
        "lm_head.weight": (vocab, a.hidden),
    }
    for i in range(a.layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (a.hidden,),
            p + "post_attention_layernorm.weight": (a.hidden,),
            p + "self_attn.q_proj.weight": (a.heads * hd, a.hidden),
            p + "self_attn.k_proj.weight": (a.kv_heads * hd, a.hidden),
            p + "self_attn.v_proj.weight": (a.kv_heads * hd, a.hidden),
            p + "self_attn.o_proj.weight": (a.hidden, a.heads * hd),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate.weight": (a.experts, a.hidden),
        }
        for e in range(a.experts):
            q = f"{p}mlp.experts.{e}."
            shapes |= {
                q + "gate_proj.weight": (a.moe_inter, a.hidden),
                q + "up_proj.weight": (a.moe_inter, a.hidden),
                q + "down_proj.weight": (a.hidden, a.moe_inter),
            }
    return shapes


def config(a: argparse.Namespace, vocab: int, tok_len: int) -> dict[str, object]:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": vocab,
        "hidden_size": a.hidden,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.hidden // a.heads,
        "intermediate_size": a.moe_inter * a.topk,
        "moe_intermediate_size": a.moe_inter,
        "num_experts": a.experts,
        "num_experts_per_tok": a.topk,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": a.max_pos,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "use_sliding_window": False,
        "bos_token_id": SPECIALS.index("<|endoftext|>"),
        "eos_token_id": SPECIALS.index("<|im_end|>"),
        "pad_token_id": SPECIALS.index("<pad>"),
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "servesweep_note": f"random weights (tools/rehearsal/make_model.py); tokenizer {tok_len}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--moe-inter", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--max-pos", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    weights = a.out / "model.safetensors"
    if (a.out / "config.json").exists() and weights.exists():
        print(json.dumps({"out": str(a.out), "kept": True}))
        return

    import torch
    from safetensors.torch import save_file

    t0 = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    tok_len = write_tokenizer(a.out, a.vocab, a.seed)
    vocab = (max(a.vocab, tok_len) + 63) // 64 * 64  # embedding rows padded, as checkpoints do
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(a.seed)
    tensors = {}
    for name, shape in tensor_shapes(a, vocab).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.bfloat16, device=device)
        else:
            t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02
            t = t.to(torch.bfloat16)
        tensors[name] = t.cpu()
    (a.out / "config.json").write_text(json.dumps(config(a, vocab, tok_len), indent=2))
    (a.out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 2, "do_sample": False})
    )
    tmp = weights.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.rename(weights)  # last: a folder with weights is complete
    params = sum(t.numel() for t in tensors.values())
    print(
        json.dumps(
            {
                "out": str(a.out),
                "params": params,
                "vocab": vocab,
                "device": device,
                "seconds": round(time.monotonic() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
